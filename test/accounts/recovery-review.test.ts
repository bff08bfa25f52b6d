import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { login, startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { startSmtpServer } from '../support/smtp';
import { teamHelpers, type User } from '../support/teams';
import { createKey } from '../support/keys';

/**
 * A stolen session plants access that should not outlive the password reset: grants need a fresh
 * sign-in, and a reset undoes those made in the RECOVERY_REVIEW_DAYS before it, listed for the owner to
 * keep or remove (GET /profile/recovery-review).
 */
const HOUR = 3600_000;
const DAY = 24 * HOUR;
const NEW_PASSWORD = 'the owner’s new password';

let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;
let clock: ManualClockFollowingTime;

beforeAll(async () => {
  smtp = await startSmtpServer();
  // Sessions last a day here, so that one signed in an hour ago is still a session.
  s = await startTestService({ env: { SMTP_URL: smtp.url, JWT_TTL_SECONDS: String(24 * 3600) } });
  clock = s.c.clock as ManualClockFollowingTime;
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

const { newUser, invite, mailedToken, team, status, settled, requestLink, approve } = teamHelpers(() => ({ s, smtp }));

/** Takes the newest mail to `email` whose subject matches out of the inbox. */
async function takeMail(email: string, subject: RegExp) {
  const find = () => smtp.received.filter((m) => JSON.stringify(m.to).includes(email) && subject.test(m.subject ?? '')).at(-1);
  await expect.poll(() => Boolean(find()), { timeout: 10_000 }).toBe(true);
  const mail = find()!;
  smtp.received.splice(smtp.received.indexOf(mail), 1);
  return mail;
}

/** The owner resets the password by email; answers a session signed in with the new one. */
async function resetPassword(u: User): Promise<string> {
  await Promise.all(['127.0.0.1', '::ffff:127.0.0.1', '::1'].flatMap((ip) => [`forgot:${ip}`, `reset:${ip}`].map((k) => s.c.limiters.publicIp.delete(k))));
  expect((await s.api('POST', '/auth/forgot-password', { body: { email: u.email } })).status).toBe(202);
  const token = /Reset token: (\S+)/.exec((await takeMail(u.email, /^Reset your password$/)).text ?? '')![1];
  const reset = await s.api('POST', '/auth/reset-password', { body: { token, new_password: NEW_PASSWORD } });
  expect(reset.status, JSON.stringify(reset.body)).toBe(200);
  return login(s.api, { username: u.username, password: NEW_PASSWORD });
}

const review = async (token: string, query = '') => {
  const res = await s.api('GET', `/profile/recovery-review${query}`, { token });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.items as { item_id: string; kind: string; target_id: string; label: string; action: string; decision: string | null }[];
};

const roleOf = async (u: User) => (await s.api('GET', '/organization', { token: u.token })).body.role as string;
const fresh = async (u: User) => ({ ...u, token: await login(s.api, u) });

describe('grants need a recent sign-in', () => {
  it('refuses a session signed in an hour ago on the invitation, the link request and its approval (the whole reproduction)', async () => {
    const owner = await newUser();
    const invitee = await newUser();
    await createKey(s.api, owner.token);
    clock.advance(HOUR);
    const invited = await s.api('POST', '/organization/invitations', { token: owner.token, body: { email: invitee.email, role: 'admin' } });
    expect([invited.status, invited.body.code]).toEqual([403, 'reauthentication_required']);
    expect((await s.api('POST', '/api-keys/generate', { token: owner.token, body: { name: 'x', scopes: ['keys:read'] } })).body.code).toBe(
      'reauthentication_required',
    );

    // Even with an invitation made in time and accepted, the old session cannot approve the link to its keys.
    const owner2 = await fresh(owner);
    const { token } = await invite(owner2, invitee.email, 'admin');
    const member = await fresh(invitee);
    expect((await s.api('POST', '/organization/invitations/accept', { token: member.token, body: { token } })).status).toBe(200);
    await requestLink(member, owner);
    const approved = await s.api('POST', `/team-access/links/${member.id}/approve`, { token: owner.token, body: { source_user_id: owner.id } });
    expect([approved.status, approved.body.code]).toEqual([403, 'reauthentication_required']);
    const asked = await s.api('POST', '/team-access/link', { token: invitee.token, body: { source_user_id: owner.id } });
    expect([asked.status, asked.body.code]).toEqual([403, 'reauthentication_required']);
    expect((await settled(member)).inherited_keys).toBe(0);
  });
});

describe('a password reset undoes the grants of the days before it', () => {
  /**
   * The stolen session (signed in recently) invites an admin and a member, approves the admin's link to
   * the owner's keys, invites another address and adds a webhook.
   */
  async function plant() {
    const owner = await newUser();
    const admin = await newUser();
    const member = await newUser();
    const outsider = await newUser();
    await createKey(s.api, owner.token);
    const { token } = await invite(owner, admin.email, 'admin');
    expect((await s.api('POST', '/organization/invitations/accept', { token: admin.token, body: { token } })).status).toBe(200);
    const { token: memberToken } = await invite(owner, member.email, 'member');
    expect((await s.api('POST', '/organization/invitations/accept', { token: member.token, body: { token: memberToken } })).status).toBe(200);
    await requestLink(admin, owner);
    expect((await s.api('POST', `/team-access/links/${admin.id}/approve`, { token: owner.token, body: { source_user_id: owner.id } })).status).toBe(200);
    expect((await settled(admin)).inherited_keys).toBe(1);
    const { invitation } = await invite(owner, outsider.email, 'member');
    const outsiderToken = await mailedToken(outsider.email.toLowerCase());
    const hook = await s.api('POST', '/webhooks', { token: owner.token, body: { url: 'http://127.0.0.1:9/hook', description: 'audit sink' } });
    expect(hook.status).toBe(201);
    return { owner, admin, member, outsider, invitationId: invitation.invitation_id as string, outsiderToken, webhookId: hook.body.webhook_id as string };
  }

  it('after the reset the admin is a plain member without the owner’s keys, the invitation is revoked and the webhook paused; all listed for review and in the email', async () => {
    const p = await plant();
    const session = await resetPassword(p.owner);

    expect(await roleOf(p.admin)).toBe('member');
    expect((await status(p.admin)).approval).toBe('pending');
    expect((await settled(p.admin)).inherited_keys).toBe(0);
    const accept = await s.api('POST', '/organization/invitations/accept', { token: p.outsider.token, body: { token: p.outsiderToken } });
    expect([accept.status, accept.body.code]).toEqual([410, 'invitation_revoked']);
    const hook = await s.api('GET', `/webhooks/${p.webhookId}`, { token: session });
    expect(hook.body).toMatchObject({ enabled: false, disabled_reason: 'password_reset' });
    // The plain member who joined in that time keeps its place: it is listed, not removed.
    expect(await roleOf(p.member)).toBe('member');

    const items = await review(session);
    expect(items.map((i) => [i.kind, i.target_id, i.action, i.decision]).sort()).toEqual(
      [
        ['member', p.admin.id, 'demoted', null],
        ['member', p.member.id, 'listed', null],
        ['invitation', p.invitationId, 'revoked', null],
        ['team_link', p.admin.id, 'returned_to_pending', null],
        ['webhook', p.webhookId, 'paused', null],
      ].sort(),
    );
    expect(items.find((i) => i.kind === 'webhook')!.label).toBe('127.0.0.1:9 (audit sink)');

    const mail = await takeMail(p.owner.email, /password was reset/i);
    expect(mail.text).toContain(`member ${p.admin.email} (invited as admin): made a plain member`);
    expect(mail.text).toContain(`invitation ${p.outsider.email.toLowerCase()} (as member): revoked`);
    expect(mail.text).toContain(`team access link ${p.admin.email} inheriting the keys of you: back to awaiting approval`);
    expect(mail.text).toContain('webhook 127.0.0.1:9 (audit sink): paused');
    expect(mail.text).toMatch(/\/recovery-review/);

    const audit = await s.c.db('audit_logs').where({ user_id: p.owner.id, action: 'passwords.reset', status: 'success' }).first();
    expect(audit.details).toMatchObject({ grants_undone_for_review: 5 });
    expect(await s.c.db('audit_logs').where({ user_id: p.admin.id, action: 'organization_members.change_role' })).toHaveLength(1);
    expect(await s.c.db('audit_logs').where({ user_id: p.owner.id, action: 'team_links.withdraw_approval' })).toHaveLength(1);
  });

  it('keeps (restores) or removes each item once, with a recent sign-in, audited', async () => {
    const p = await plant();
    let session = await resetPassword(p.owner);
    const items = await review(session);
    const item = (kind: string, target: string) => items.find((i) => i.kind === kind && i.target_id === target)!.item_id;
    const decide = (id: string, what: 'keep' | 'remove', token = session) => s.api('POST', `/profile/recovery-review/${id}/${what}`, { token });

    const link = await decide(item('team_link', p.admin.id), 'keep');
    expect(link.status, JSON.stringify(link.body)).toBe(200);
    expect(link.body).toMatchObject({ decision: 'kept', outcome: 'restored' });
    expect((await status(p.admin)).approval).toBe('approved');
    await expect.poll(async () => (await settled(p.admin)).inherited_keys, { timeout: 15_000 }).toBe(1);

    const again = await decide(item('team_link', p.admin.id), 'keep');
    expect([again.status, again.body.code]).toEqual([409, 'review_item_decided']);
    expect(again.headers.get('content-type')).toMatch(/^application\/problem\+json/);

    expect((await decide(item('webhook', p.webhookId), 'keep')).body).toMatchObject({ outcome: 'resumed' });
    expect((await s.api('GET', `/webhooks/${p.webhookId}`, { token: session })).body).toMatchObject({ enabled: true, disabled_reason: null });

    expect((await decide(item('member', p.admin.id), 'keep')).body).toMatchObject({ outcome: 'restored' });
    expect(await roleOf(p.admin)).toBe('admin');

    expect((await decide(item('member', p.member.id), 'remove')).body).toMatchObject({ decision: 'removed', outcome: 'removed' });
    expect((await s.api('GET', '/organization', { token: p.member.token })).body.owner_user_id).toBe(p.member.id);

    // Reopening needs an unexpired invitation: keep it now, and its token joins again.
    expect((await decide(item('invitation', p.invitationId), 'keep')).body).toMatchObject({ outcome: 'reopened' });
    expect((await s.api('POST', '/organization/invitations/accept', { token: p.outsider.token, body: { token: p.outsiderToken } })).status).toBe(200);

    expect(await review(session, '?state=open')).toEqual([]);
    const kept = await s.c.db('audit_logs').where({ user_id: p.owner.id, action: 'recovery_review_items.keep', status: 'success' });
    expect(kept).toHaveLength(4);
    expect(await s.c.db('audit_logs').where({ user_id: p.owner.id, action: 'recovery_review_items.remove', status: 'success' })).toHaveLength(1);
    expect(await s.c.db('audit_logs').where({ user_id: p.owner.id, action: 'recovery_review_items.keep', status: 'failure' })).toHaveLength(1);

    // Deciding needs a recent sign-in too.
    clock.advance(s.config.recentSignInSeconds * 1000 + 60_000);
    const stale = await decide(randomUUID(), 'remove');
    expect([stale.status, stale.body.code]).toEqual([403, 'reauthentication_required']);
    session = await login(s.api, { username: p.owner.username, password: NEW_PASSWORD });
    expect((await s.api('GET', '/profile/recovery-review', { token: session })).status).toBe(200);
  });

  it('answers 404 for another account’s item or an unknown one (audited when it exists), and 422 for a malformed id', async () => {
    const p = await plant();
    const session = await resetPassword(p.owner);
    const [mine] = await review(session);
    const stranger = await newUser();
    const theirs = await s.api('POST', `/profile/recovery-review/${mine.item_id}/keep`, { token: stranger.token });
    expect([theirs.status, theirs.body.code]).toEqual([404, 'review_item_not_found']);
    const unknown = await s.api('POST', `/profile/recovery-review/${randomUUID()}/remove`, { token: stranger.token });
    expect([unknown.status, unknown.body.code]).toEqual([404, 'review_item_not_found']);
    expect(await s.c.db('audit_logs').where({ user_id: stranger.id, action: 'recovery_review_items.deny_access' })).toHaveLength(1);
    expect((await s.api('POST', '/profile/recovery-review/not-a-uuid/keep', { token: stranger.token })).status).toBe(422);
    expect(await review(stranger.token)).toEqual([]);
    // Nothing was decided by the stranger's tries.
    expect((await review(session)).every((i) => i.decision === null)).toBe(true);
  });

  it('removing a webhook deletes it; removing a link ends it; keeping something gone since is 409 and the item stays open', async () => {
    const p = await plant();
    const session = await resetPassword(p.owner);
    const items = await review(session);
    const item = (kind: string) => items.find((i) => i.kind === kind && i.action !== 'listed')!.item_id;
    const removed = await s.api('POST', `/profile/recovery-review/${item('team_link')}/remove`, { token: session });
    expect(removed.body).toMatchObject({ outcome: 'removed' });
    expect((await status(p.admin)).linked).toBe(false);

    expect((await s.api('DELETE', `/webhooks/${p.webhookId}`, { token: session })).status).toBe(204);
    const gone = await s.api('POST', `/profile/recovery-review/${item('webhook')}/keep`, { token: session });
    expect([gone.status, gone.body.code]).toEqual([409, 'review_target_changed']);
    expect((await s.api('POST', `/profile/recovery-review/${item('webhook')}/remove`, { token: session })).body).toMatchObject({ outcome: 'already_gone' });
  });

  it('decides an item once under parallel requests', async () => {
    const p = await plant();
    const session = await resetPassword(p.owner);
    const hook = (await review(session)).find((i) => i.kind === 'webhook')!;
    const both = await Promise.all(
      (['keep', 'remove'] as const).map((what) => s.api('POST', `/profile/recovery-review/${hook.item_id}/${what}`, { token: session })),
    );
    expect(both.map((r) => r.status).sort()).toEqual([200, 409]);
    expect(both.find((r) => r.status === 409)!.body.code).toBe('review_item_decided');
    const winner = both.find((r) => r.status === 200)!.body.decision as string;
    const endpoint = await s.c.db('webhook_endpoints').where({ id: p.webhookId }).first();
    if (winner === 'kept') expect(endpoint.enabled).toBe(true);
    else expect(endpoint).toBeUndefined();
  });

  it('undoes what an admin brought in by the stolen session did with its role: its invitations and the links it approved', async () => {
    const [owner, grantee, source] = await team(3);
    await createKey(s.api, source.token);
    const admin = await newUser();
    const stranger = await newUser();
    const { token } = await invite(owner, admin.email, 'admin');
    expect((await s.api('POST', '/organization/invitations/accept', { token: admin.token, body: { token } })).status).toBe(200);
    const { invitation } = await invite(admin, stranger.email, 'member');
    await requestLink(grantee, source);
    await approve(grantee, source, admin);
    expect((await settled(grantee)).inherited_keys).toBe(1);

    const session = await resetPassword(owner);
    expect(await roleOf(admin)).toBe('member');
    expect((await settled(grantee)).inherited_keys).toBe(0);
    const items = await review(session);
    expect(items.map((i) => [i.kind, i.target_id, i.action]).sort()).toEqual(
      [
        ['invitation', invitation.invitation_id, 'revoked'],
        ['member', admin.id, 'demoted'],
        ['member', grantee.id, 'listed'],
        ['member', source.id, 'listed'],
        ['team_link', grantee.id, 'returned_to_pending'],
      ].sort(),
    );
    // Keeping the link gives back the approval it had, by whom it had it.
    const link = items.find((i) => i.kind === 'team_link')!;
    expect((await s.api('POST', `/profile/recovery-review/${link.item_id}/keep`, { token: session })).body).toMatchObject({ outcome: 'restored' });
    expect((await status(grantee)).approval).toBe('approved');
    expect((await s.c.db('team_links').where({ grantee_id: grantee.id }).first()).approved_by).toBe(admin.id);
  });

  it('leaves what was granted before the window alone', async () => {
    const owner = await newUser();
    const admin = await newUser();
    await createKey(s.api, owner.token);
    const { token } = await invite(owner, admin.email, 'admin');
    expect((await s.api('POST', '/organization/invitations/accept', { token: admin.token, body: { token } })).status).toBe(200);
    await requestLink(admin, owner);
    expect((await s.api('POST', `/team-access/links/${admin.id}/approve`, { token: owner.token, body: { source_user_id: owner.id } })).status).toBe(200);
    const hook = await s.api('POST', '/webhooks', { token: owner.token, body: { url: 'http://127.0.0.1:9/old' } });
    expect(hook.status).toBe(201);
    expect((await settled(admin)).inherited_keys).toBe(1);

    clock.advance((s.config.recoveryReviewDays + 1) * DAY);
    const again = { owner: await fresh(owner), admin: await fresh(admin) };
    const session = await resetPassword(again.owner);
    expect(await roleOf(again.admin)).toBe('admin');
    expect((await settled(again.admin)).inherited_keys).toBe(1);
    expect((await s.api('GET', `/webhooks/${hook.body.webhook_id}`, { token: session })).body).toMatchObject({ enabled: true, disabled_reason: null });
    expect(await review(session)).toEqual([]);
    expect((await takeMail(owner.email, /password was reset/i)).text).not.toMatch(/recovery-review/);
  });
});
