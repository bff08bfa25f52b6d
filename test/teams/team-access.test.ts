import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { teamHelpers, type User } from '../support/teams';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';
import { startSmtpServer } from '../support/smtp';
import { syncGrants } from '../../lib/teams/team-access';

/**
 * Organizations (invitations by mail, members, removal) and team access sync: linking inherits the
 * source's own keys through grants the `team-sync` queue computes; unlink, removal and the source's
 * departure revoke; grants are one hop; the sync is idempotent.
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

const { newUser, invite, team, status, settled, link } = teamHelpers(() => ({ s, smtp }));
const file = (name = 'note.txt', text = 'team secret') => [{ name, data: Buffer.from(text) }];

const keyList = async (u: User) => (await s.api('GET', '/keys/list?page_size=100', { token: u.token })).body.items as any[];
const grantsOf = async (u: User) =>
  s.c.db('team_grants').where({ grantee_id: u.id }).orderBy('lineage_id').select<{ lineage_id: string; source_id: string }[]>('lineage_id', 'source_id');
const encryptStatus = async (u: User, fingerprint: string) =>
  (await s.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint, files: file() } })).status;

describe('organizations and invitations', () => {
  it('gives every account its own organization; invites by mail; the invitee joins and is listed', async () => {
    const [owner, member] = await team(2);
    const org = await s.api('GET', '/organization', { token: owner.token });
    expect(org.body).toMatchObject({ owner_user_id: owner.id, role: 'owner', member_count: 2 });
    const mine = await s.api('GET', '/organization', { token: member.token });
    expect(mine.body).toMatchObject({ organization_id: org.body.organization_id, role: 'member' });
    const members = await s.api('GET', '/organization/members', { token: member.token });
    expect(members.body).toMatchObject({ page: 1, page_size: 20, total: 2 });
    expect(members.body.items.map((m: any) => [m.user_id, m.role])).toEqual([
      [owner.id, 'owner'],
      [member.id, 'member'],
    ]);
    // The invitee's own one-member organization is gone; the token hash only is stored.
    expect(await s.c.db('organizations').where({ owner_id: member.id })).toHaveLength(0);
    const row = await s.c.db('organization_invitations').where({ accepted_by: member.id }).first();
    expect(row.token_hash).toMatch(/^[0-9a-f]{64}$/);
    const actions = (await s.c.db('audit_logs').where({ user_id: member.id }).pluck('action')) as string[];
    expect(actions).toContain('organization_members.join');
    expect(JSON.stringify(await s.c.db('audit_logs').whereIn('user_id', [owner.id, member.id]))).not.toContain('kms_inv_');
  });

  it('refuses a used, expired, unknown or someone else’s invitation token', async () => {
    const [owner] = await team(1);
    const invitee = await newUser();
    const other = await newUser();
    const { token } = await invite(owner, invitee.email);

    const wrong = await s.api('POST', '/organization/invitations/accept', { token: other.token, body: { token } });
    expect(wrong.status).toBe(403);
    expect(wrong.body.code).toBe('invitation_wrong_account');
    expect(await s.c.db('audit_logs').where({ user_id: other.id, action: 'organization_invitations.accept', status: 'failure' })).toHaveLength(1);

    expect((await s.api('POST', '/organization/invitations/accept', { token: invitee.token, body: { token } })).status).toBe(200);
    const again = await s.api('POST', '/organization/invitations/accept', { token: invitee.token, body: { token } });
    expect([again.status, again.body.code]).toEqual([410, 'invitation_used']);
    const unknown = await s.api('POST', '/organization/invitations/accept', { token: invitee.token, body: { token: 'kms_inv_nope' } });
    expect([unknown.status, unknown.body.code]).toEqual([400, 'invalid_invitation_token']);

    const late = await newUser();
    const { token: stale } = await invite(owner, late.email);
    const clock = s.c.clock as ManualClockFollowingTime;
    clock.advance(73 * 3600_000);
    try {
      const login = await s.api('POST', '/auth/login', { body: { identifier: late.username, password: late.password } });
      const expired = await s.api('POST', '/organization/invitations/accept', { token: login.body.session.token, body: { token: stale } });
      expect([expired.status, expired.body.code]).toEqual([410, 'invitation_expired']);
    } finally {
      clock.advance(-73 * 3600_000);
    }
  });

  it('lets only the owner or an admin invite, needs a session, and refuses current members', async () => {
    const [owner, member] = await team(2);
    const outsider = await newUser();
    const byMember = await s.api('POST', '/organization/invitations', { token: member.token, body: { email: outsider.email } });
    expect([byMember.status, byMember.body.code]).toEqual([403, 'organization_admin_required']);
    const byKey = await s.api('POST', '/organization/invitations', { token: owner.apiKey, body: { email: outsider.email } });
    expect(byKey.status).toBe(403);
    const dup = await s.api('POST', '/organization/invitations', { token: owner.token, body: { email: member.email.toUpperCase() } });
    expect([dup.status, dup.body.code]).toEqual([409, 'already_member']);
    expect((await s.api('POST', '/organization/invitations', { token: owner.token, body: { email: 'not an email' } })).status).toBe(422);
  });

  it('lists invitations with their expiry and state to the owner and admins, who revoke them; a revoked one cannot be accepted', async () => {
    const [owner, admin, member] = await team(3, ['admin', 'member']);
    const [invitee, future] = [await newUser(), await newUser()];
    const { invitation, token } = await invite(admin, invitee.email);
    const { invitation: forAdmin } = await invite(owner, future.email, 'admin');

    const listed = await s.api('GET', '/organization/invitations?state=pending', { token: admin.token });
    expect(listed.status, JSON.stringify(listed.body)).toBe(200);
    expect(listed.body.items.map((i: any) => i.invitation_id).sort()).toEqual([invitation.invitation_id, forAdmin.invitation_id].sort());
    expect(listed.body.items.find((i: any) => i.invitation_id === invitation.invitation_id)).toMatchObject({
      email: invitee.email.toLowerCase(),
      role: 'member',
      state: 'pending',
      invited_by_user_id: admin.id,
      revoked_at: null,
    });
    expect(Date.parse(invitation.expires_at) - Date.parse(invitation.created_at)).toBe(72 * 3600_000);
    expect((await s.api('GET', '/organization/invitations', { token: owner.apiKey })).status).toBe(200);
    const byMember = await s.api('GET', '/organization/invitations', { token: member.token });
    expect([byMember.status, byMember.body.code]).toEqual([403, 'organization_admin_required']);
    expect((await s.api('DELETE', `/organization/invitations/${invitation.invitation_id}`, { token: member.token })).status).toBe(403);

    // Only the owner revokes an admin's invitation; another organization's is 404.
    const byAdmin = await s.api('DELETE', `/organization/invitations/${forAdmin.invitation_id}`, { token: admin.token });
    expect([byAdmin.status, byAdmin.body.code]).toEqual([403, 'organization_owner_required']);
    const [stranger] = await team(1);
    expect((await s.api('DELETE', `/organization/invitations/${invitation.invitation_id}`, { token: stranger.token })).body.code).toBe('invitation_not_found');
    expect((await s.api('DELETE', `/organization/invitations/${invitation.invitation_id}`, { token: admin.apiKey })).status).toBe(403);

    expect((await s.api('DELETE', `/organization/invitations/${invitation.invitation_id}`, { token: admin.token })).status).toBe(204);
    expect((await s.api('DELETE', `/organization/invitations/${invitation.invitation_id}`, { token: admin.token })).status).toBe(204);
    const accept = await s.api('POST', '/organization/invitations/accept', { token: invitee.token, body: { token } });
    expect([accept.status, accept.body.code]).toEqual([410, 'invitation_revoked']);
    const revoked = (await s.api('GET', '/organization/invitations?state=revoked', { token: owner.token })).body.items;
    expect(revoked).toEqual([expect.objectContaining({ invitation_id: invitation.invitation_id, state: 'revoked' })]);
    expect(revoked[0].revoked_at).toBeTruthy();
    expect(await s.c.db('audit_logs').where({ user_id: admin.id, action: 'organization_invitations.revoke', target: invitation.invitation_id })).toHaveLength(
      1,
    );

    // An accepted invitation is not revoked.
    const { invitation: used, token: usedToken } = await invite(owner, future.email, 'member');
    expect((await s.api('POST', '/organization/invitations/accept', { token: future.token, body: { token: usedToken } })).status).toBe(200);
    const late = await s.api('DELETE', `/organization/invitations/${used.invitation_id}`, { token: owner.token });
    expect([late.status, late.body.code]).toEqual([409, 'invitation_used']);
    expect((await s.api('GET', '/organization/invitations?state=accepted', { token: owner.token })).body.items.map((i: any) => i.invitation_id)).toContain(
      used.invitation_id,
    );
  });

  it('refuses to take an owner with members out of its organization', async () => {
    const [owner] = await team(2);
    const [other] = await team(1);
    const { token } = await invite(other, owner.email);
    const res = await s.api('POST', '/organization/invitations/accept', { token: owner.token, body: { token } });
    expect([res.status, res.body.code]).toEqual([409, 'organization_not_empty']);
  });

  it("answers 404 for another organization's member id, audited", async () => {
    const [owner] = await team(2);
    const [, stranger] = await team(2);
    const res = await s.api('DELETE', `/organization/members/${stranger.id}`, { token: owner.token });
    expect([res.status, res.body.code]).toEqual([404, 'member_not_found']);
    expect(await s.c.db('audit_logs').where({ user_id: owner.id, action: 'organization_members.deny_access' })).toHaveLength(1);
    expect((await s.api('DELETE', `/organization/members/${owner.id}`, { token: owner.token })).body.code).toBe('owner_cannot_leave');
  });
});

describe('team access', () => {
  it('links to a teammate and inherits its keys: listed with the owner, encrypt, public key, share; never manage', async () => {
    const [owner, member] = await team(2);
    const key = await createKey(s.api, owner.token, { label: 'shared' });
    const own = await createKey(s.api, member.token, { label: 'mine' });

    const search = await s.api('GET', `/team-access/members?q=${encodeURIComponent(owner.username.slice(0, 8).toUpperCase())}`, { token: member.token });
    expect(search.body.items.map((m: any) => m.user_id)).toEqual([owner.id]);
    expect((await s.api('GET', '/team-access/members?q=%25', { token: member.token })).body.total).toBe(0); // a prefix, not a pattern

    const st = await link(member, owner);
    expect(st).toMatchObject({ linked: true, state: 'ok', source: { user_id: owner.id }, inherited_keys: 1, last_error: null });
    expect(st.last_synced_at).toBeTruthy();

    const list = await keyList(member);
    expect(list.find((k) => k.lineage_id === own.lineage_id)).toMatchObject({ inherited: false, owner: null });
    expect(list.find((k) => k.lineage_id === key.lineage_id)).toMatchObject({ inherited: true, owner: { user_id: owner.id, username: owner.username } });
    expect((await keyList(owner)).map((k) => k.lineage_id)).toEqual([key.lineage_id]);

    const job = await encrypt(s.api, member.token, key.fingerprint, file());
    expect(job.result.fingerprint_used).toBe(key.fingerprint);
    const pub = await s.api('POST', '/keys/get-public-key', { token: member.token, body: { fingerprint: key.fingerprint } });
    expect(pub.status).toBe(200);
    const share = await s.api('POST', '/keys/share/create', { token: member.token, body: { fingerprint: key.fingerprint } });
    expect(share.status, JSON.stringify(share.body)).toBe(201);
    expect((await s.api('GET', `/keys/share/${share.body.share_token}`)).status).toBe(200);

    // Decrypt still needs the key's passphrase.
    const ciphertext = await download(s.api, member.token, job.job_id ?? job.id);
    const wrong = await s.api('POST', '/keys/decrypt', {
      token: member.token,
      form: { fingerprint: key.fingerprint, passphrase: 'not the passphrase', files: [{ name: 'n.gpg', data: ciphertext }] },
    });
    expect(wrong.body.code).toBe('wrong_passphrase');
    const dec = await runJob(s.api, member.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'n.gpg', data: ciphertext }],
    });
    expect(dec.state).toBe('completed');

    // Managing stays with the owner.
    expect((await s.api('POST', '/keys/disable-key', { token: member.token, body: { fingerprint: key.fingerprint } })).status).toBe(404);
    expect((await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: member.token, body: {} })).status).toBe(404);
    expect((await s.api('POST', `/keys/${key.fingerprint}/rotation-schedule`, { token: member.token, body: { rotation_interval_days: 5 } })).status).toBe(404);

    const events = (await s.api('GET', '/events/history', { token: member.token })).body.items.map((e: any) => e.type);
    expect(events).toEqual(expect.arrayContaining(['team_links.linked', 'team_links.synced']));
    const actions = (await s.c.db('audit_logs').where({ user_id: member.id }).pluck('action')) as string[];
    expect(actions).toEqual(expect.arrayContaining(['team_links.link', 'team_links.sync']));
  });

  it('keeps access across a rotation without a re-sync (the caller encrypts to the new generation); re-syncs when the source generates or disables keys', async () => {
    const [owner, member] = await team(2);
    const key = await createKey(s.api, owner.token);
    const synced = (await link(member, owner)).last_synced_at;

    const rotated = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: owner.token, body: {}, headers: { prefer: 'wait=30' } });
    expect(rotated.status, JSON.stringify(rotated.body)).toBe(200);
    const next = rotated.body.result.new_fingerprint as string;
    expect(next).not.toBe(key.fingerprint);
    // A grant names the lineage: the rotation leaves the link as it was, synced and not queued again.
    expect(await status(member)).toMatchObject({ state: 'ok', inherited_keys: 1, last_synced_at: synced });
    const job = await encrypt(s.api, member.token, next, file());
    expect(job.result.fingerprint_used).toBe(next);
    // An older generation's fingerprint names the lineage too: the current one is used.
    expect((await encrypt(s.api, member.token, key.fingerprint, file())).result.fingerprint_used).toBe(next);

    const second = await createKey(s.api, owner.token, { label: 'second' });
    await expect.poll(async () => (await settled(member)).inherited_keys, { timeout: 15_000 }).toBe(2);
    expect((await keyList(member)).map((k) => k.lineage_id)).toContain(second.lineage_id);

    expect((await s.api('POST', '/keys/disable-key', { token: owner.token, body: { fingerprint: second.fingerprint } })).status).toBe(200);
    await expect.poll(async () => (await grantsOf(member)).map((g) => g.lineage_id), { timeout: 15_000 }).toEqual([key.lineage_id]);
    expect(await encryptStatus(member, second.fingerprint)).toBe(404);
  });

  it('unlinks: inherited access ends at once (encrypt 404, shares 410)', async () => {
    const [owner, member] = await team(2);
    const key = await createKey(s.api, owner.token);
    await link(member, owner);
    await encrypt(s.api, member.token, key.fingerprint, file());
    const share = await s.api('POST', '/keys/share/create', { token: member.token, body: { fingerprint: key.fingerprint } });

    const res = await s.api('DELETE', '/team-access/link', { token: member.token });
    expect(res.body).toEqual({ source_user_id: owner.id, revoked_keys: 1 });
    expect(await encryptStatus(member, key.fingerprint)).toBe(404);
    expect((await s.api('POST', '/keys/get-public-key', { token: member.token, body: { fingerprint: key.fingerprint } })).status).toBe(404);
    expect((await keyList(member)).length).toBe(0);
    const view = await s.api('GET', `/keys/share/${share.body.share_token}`);
    expect([view.status, view.body.code]).toEqual([410, 'share_access_revoked']);
    expect(await status(member)).toMatchObject({ linked: false, state: 'unlinked', inherited_keys: 0 });
    // Unlinking again is harmless (204, nothing done), as repeating any DELETE is.
    expect((await s.api('DELETE', '/team-access/link', { token: member.token })).status).toBe(204);
    expect(await s.c.db('audit_logs').where({ user_id: member.id, action: 'team_links.unlink' })).toHaveLength(1);
  });

  it('refuses a link across organizations (404, audited) and to oneself; needs a session to link', async () => {
    const [, member] = await team(2);
    const [stranger] = await team(1);
    const res = await s.api('POST', '/team-access/link', { token: member.token, body: { source_user_id: stranger.id } });
    expect([res.status, res.body.code]).toEqual([404, 'member_not_found']);
    expect(await s.c.db('audit_logs').where({ user_id: member.id, action: 'team_members.deny_access' })).toHaveLength(1);
    const unknown = await s.api('POST', '/team-access/link', { token: member.token, body: { source_user_id: '00000000-0000-4000-8000-000000000000' } });
    expect(unknown.status).toBe(404);
    expect(await s.c.db('audit_logs').where({ user_id: member.id, action: 'team_members.deny_access' })).toHaveLength(1);
    expect((await s.api('POST', '/team-access/link', { token: member.token, body: { source_user_id: member.id } })).body.code).toBe('cannot_link_self');
    expect((await s.api('POST', '/team-access/link', { token: member.apiKey, body: { source_user_id: stranger.id } })).status).toBe(403);
    expect((await s.api('POST', '/team-access/link', { token: member.token, body: { source_user_id: 'nope' } })).status).toBe(422);
    expect((await s.api('GET', '/team-access/members', { token: member.token })).body.items.map((m: any) => m.user_id)).not.toContain(stranger.id);
  });

  it('gives one hop only: A links to B, B links to C, A gets B’s own keys', async () => {
    const [a, b, c] = await team(3);
    const bKey = await createKey(s.api, b.token, { label: 'b' });
    const cKey = await createKey(s.api, c.token, { label: 'c' });
    await link(b, c);
    await link(a, b);
    expect((await keyList(b)).map((k) => k.lineage_id).sort()).toEqual([bKey.lineage_id, cKey.lineage_id].sort());
    expect((await keyList(a)).map((k) => k.lineage_id)).toEqual([bKey.lineage_id]);
    expect(await encryptStatus(a, cKey.fingerprint)).toBe(404);
    // Changing the source swaps the grants.
    const changed = await link(a, c);
    expect(changed.source.user_id).toBe(c.id);
    expect((await keyList(a)).map((k) => k.lineage_id)).toEqual([cKey.lineage_id]);
  });

  it("revokes a removed member's inherited access, and what others inherited from it", async () => {
    const [owner, member, third] = await team(3);
    const key = await createKey(s.api, owner.token);
    const memberKey = await createKey(s.api, member.token, { label: 'member' });
    await link(member, owner);
    await link(third, member);
    expect(await encryptStatus(third, memberKey.fingerprint)).toBe(202);

    expect((await s.api('DELETE', `/organization/members/${member.id}`, { token: owner.token })).status).toBe(204);
    expect(await encryptStatus(member, key.fingerprint)).toBe(404);
    expect(await status(member)).toMatchObject({ linked: false, inherited_keys: 0 });
    expect((await s.api('GET', '/organization', { token: member.token })).body).toMatchObject({ role: 'owner', member_count: 1 });
    // third linked to the removed member: its grants ended, its status says why.
    expect(await encryptStatus(third, memberKey.fingerprint)).toBe(404);
    expect(await settled(third)).toMatchObject({ linked: true, state: 'failed', last_error: 'source_unavailable', inherited_keys: 0 });
    expect(await grantsOf(third)).toEqual([]);
    const types = (await s.api('GET', '/events/history', { token: member.token })).body.items.map((e: any) => e.type);
    expect(types).toEqual(expect.arrayContaining(['organization_members.removed', 'team_links.unlinked']));
  });

  it('re-syncs when the source deletes its account', async () => {
    const [owner, member] = await team(2);
    await createKey(s.api, member.token);
    await link(owner, member);
    expect((await status(owner)).inherited_keys).toBe(1);
    expect((await s.api('POST', '/profile/delete-account', { token: member.token, body: { password: member.password } })).status).toBeLessThan(300);
    expect((await status(owner)).inherited_keys).toBe(0);
    expect(await settled(owner)).toMatchObject({ state: 'failed', last_error: 'source_unavailable' });
  });

  it('is idempotent: repeated and concurrent runs, and a run after a partial failure, leave the same grants', async () => {
    const [owner, member] = await team(2);
    const keys = [await createKey(s.api, owner.token, { label: 'k1' }), await createKey(s.api, owner.token, { label: 'k2' })];
    await link(member, owner);
    const expected = await grantsOf(member);
    expect(expected.map((g) => g.lineage_id).sort()).toEqual(keys.map((k) => k.lineage_id).sort());

    await Promise.all(Array.from({ length: 5 }, () => syncGrants(s.c, member.id, {})));
    expect(await grantsOf(member)).toEqual(expected);

    // A partial run: grants deleted, stale ones added, never committed as a whole (a crash mid-run is a
    // rolled-back transaction); and a committed partial state (some rows lost) the next run repairs.
    await s.c.db
      .transaction(async (trx) => {
        await trx('team_grants').where({ grantee_id: member.id }).delete();
        throw new Error('crash');
      })
      .catch(() => undefined);
    expect(await grantsOf(member)).toEqual(expected);
    await s.c.db('team_grants').where({ grantee_id: member.id, lineage_id: keys[0].lineage_id }).delete();
    const repaired = await syncGrants(s.c, member.id, {});
    expect(repaired.added).toEqual([keys[0].lineage_id]);
    expect(await grantsOf(member)).toEqual(expected);
    expect((await syncGrants(s.c, member.id, {})).added).toEqual([]);
    expect(await grantsOf(member)).toEqual(expected);
  });

  it('answers status and member search to managed API keys with account:read only', async () => {
    const [owner, member] = await team(2);
    const res = await s.api('GET', '/team-access/status', { token: member.apiKey });
    expect(res.body).toMatchObject({ linked: false, state: 'unlinked', inherited_keys: 0 });
    const page = await s.api('GET', '/team-access/members?page_size=1', { token: member.token });
    expect(page.body).toMatchObject({ page: 1, page_size: 1, total: 1 });
    expect(page.body.items[0].user_id).toBe(owner.id);
    expect((await s.api('GET', '/team-access/members?page_size=0', { token: member.token })).status).toBe(422);
  });
});
