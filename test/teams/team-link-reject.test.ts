import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../support/service';
import { teamHelpers, type User } from '../support/teams';
import { startSmtpServer } from '../support/smtp';

/**
 * The source of a requested team link (or a manager above it) may reject it as well as approve it: the
 * request goes, nothing was granted, and it is audited. Only a pending link is rejected; an approved one
 * is ended instead, and nobody else may decide on it.
 */
let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;

beforeAll(async () => {
  smtp = await startSmtpServer();
  s = await startTestService({ env: { SMTP_URL: smtp.url } });
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

const { team, status, requestLink, approve } = teamHelpers(() => ({ s, smtp }));
const reject = (by: User, grantee: User, sourceId: string) =>
  s.api('POST', `/team-access/links/${grantee.id}/reject`, { token: by.token, body: { source_user_id: sourceId } });

describe('POST /team-access/links/{grantee_user_id}/reject', () => {
  it('removes a pending request, audited for both sides; the grantee may ask again', async () => {
    const [owner, member, other] = await team(3);
    await requestLink(member, owner);

    const stranger = await reject(other, member, owner.id);
    expect([stranger.status, stranger.body.code]).toEqual([404, 'team_link_not_found']);
    const changed = await reject(owner, member, randomUUID());
    expect([changed.status, changed.body.code]).toEqual([409, 'team_link_changed']);

    const res = await reject(owner, member, owner.id);
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ grantee_user_id: member.id, source_user_id: owner.id, status: 'rejected' });
    expect(await status(member)).toMatchObject({ linked: false, state: 'unlinked', inherited_keys: 0 });
    expect((await s.api('GET', '/team-access/links', { token: owner.token })).body.total).toBe(0);
    const audited = await s.c.db('audit_logs').where({ action: 'team_links.reject', status: 'success' }).whereIn('user_id', [owner.id, member.id]);
    expect(audited.map((r) => r.user_id).sort()).toEqual([owner.id, member.id].sort());
    expect(audited[0].details).toEqual({ grantee_user_id: member.id, source_user_id: owner.id, rejected_by: owner.id });

    const again = await reject(owner, member, owner.id);
    expect([again.status, again.body.code]).toEqual([404, 'team_link_not_found']);
    expect((await requestLink(member, owner)).approval).toBe('pending');
  });

  it('refuses an approved link with 409 team_link_not_pending and leaves it approved', async () => {
    const [owner, member] = await team(2);
    await requestLink(member, owner);
    await approve(member, owner);
    const res = await reject(owner, member, owner.id);
    expect(res.status).toBe(409);
    expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect(res.body.code).toBe('team_link_not_pending');
    expect(await status(member)).toMatchObject({ linked: true, approval: 'approved' });
    expect(await s.c.db('audit_logs').where({ user_id: owner.id, action: 'team_links.reject', status: 'failure' })).toHaveLength(1);
  });
});
