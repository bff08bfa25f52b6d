import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { teamHelpers } from '../support/teams';
import { startSmtpServer } from '../support/smtp';

/**
 * POST /organization/invitations/lookup against the real service: what the invitation page shows before
 * anyone signs in (organization, inviter, address, expiry), by the mailed token in the body; one 404 for
 * an unknown, used, revoked or expired token; a per-address limit.
 */
let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;

beforeAll(async () => {
  smtp = await startSmtpServer();
  // One trusted proxy: each test looks up from its own X-Forwarded-For address.
  s = await startTestService({ env: { SMTP_URL: smtp.url, TRUSTED_PROXY_COUNT: '1' } });
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

const { newUser, invite } = teamHelpers(() => ({ s, smtp }));
const randomIp = () => `198.18.${randomBytes(1)[0]}.${randomBytes(1)[0]}`;
const lookUp = (token: unknown, ip = randomIp()) => s.api('POST', '/organization/invitations/lookup', { body: { token }, headers: { 'x-forwarded-for': ip } });

describe('POST /organization/invitations/lookup', () => {
  it('answers the organization, who invited, the address and the expiry, signed out, and changes nothing', async () => {
    const owner = await newUser();
    const invitee = await newUser();
    const org = (await s.api('GET', '/organization', { token: owner.token })).body;
    const { invitation, token } = await invite(owner, invitee.email, 'admin');
    const res = await lookUp(token);
    expect(res.status).toBe(200);
    expect(res.body).toEqual({
      organization_name: org.name,
      invited_by: { username: owner.username },
      email: invitee.email.toLowerCase(),
      role: 'admin',
      expires_at: invitation.expires_at,
    });
    expect(await s.c.db('organization_invitations').where({ id: invitation.invitation_id }).first()).toMatchObject({ accepted_at: null, revoked_at: null });
    // It still joins afterwards.
    expect((await s.api('POST', '/organization/invitations/accept', { token: invitee.token, body: { token } })).status).toBe(200);
  });

  it('answers one 404 problem for an unknown, used, revoked or expired token, and 422 without one', async () => {
    const owner = await newUser();
    const [a, b, c] = await Promise.all([newUser(), newUser(), newUser()]);
    const used = await invite(owner, a.email);
    expect((await s.api('POST', '/organization/invitations/accept', { token: a.token, body: { token: used.token } })).status).toBe(200);
    const revoked = await invite(owner, b.email);
    expect((await s.api('DELETE', `/organization/invitations/${revoked.invitation.invitation_id}`, { token: owner.token })).status).toBe(204);
    const stale = await invite(owner, c.email);

    const answers = [await lookUp('kms_inv_nope'), await lookUp(used.token), await lookUp(revoked.token)];
    const clock = s.c.clock as ManualClockFollowingTime;
    clock.advance(73 * 3600_000);
    try {
      answers.push(await lookUp(stale.token));
    } finally {
      clock.advance(-73 * 3600_000);
    }
    for (const res of answers) {
      expect(res.status).toBe(404);
      expect(res.headers.get('content-type')).toContain('application/problem+json');
      expect(res.body).toMatchObject({ status: 404, code: 'invitation_not_found' });
      expect(JSON.stringify(res.body)).not.toContain(owner.username);
    }
    expect((await lookUp(stale.token)).status).toBe(200);
    expect((await lookUp('')).status).toBe(422);
    expect((await s.api('POST', '/organization/invitations/lookup', { body: {} })).status).toBe(422);
  });

  it('is rate limited per address (429 with Retry-After); other addresses go on', async () => {
    const ip = randomIp();
    const statuses = [];
    for (let i = 0; i < 30; i++) statuses.push((await lookUp('kms_inv_nope', ip)).status);
    expect(statuses.every((st) => st === 404)).toBe(true);
    const refused = await lookUp('kms_inv_nope', ip);
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0);
    expect((await lookUp('kms_inv_nope')).status).toBe(404);
  });
});
