import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../support/service';
import { teamHelpers, type User } from '../support/teams';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';
import { startSmtpServer } from '../support/smtp';

/**
 * Team access needs the source's consent: a link grants nothing until the source member (or an
 * organization manager above it) approves it; both sides see it and either ends it. A teammate's wrong
 * passphrases on an inherited key spend his own budget only, and the key's owner hears of them.
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

const { team, status, settled, requestLink, approve, link } = teamHelpers(() => ({ s, smtp }));
const file = () => [{ name: 'note.txt', data: Buffer.from('team secret') }];
const encryptStatus = async (u: User, fingerprint: string) =>
  (await s.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint, files: file() } })).status;
const eventTypes = async (u: User) => (await s.api('GET', '/events/history', { token: u.token })).body.items.map((e: { type: string }) => e.type) as string[];
const links = async (u: User, query = '') => (await s.api('GET', `/team-access/links${query}`, { token: u.token })).body;

describe('team access links need the source’s approval', () => {
  it('grants nothing while requested; the source sees the request and approves; then the keys flow', async () => {
    const [owner, member] = await team(2);
    const key = await createKey(s.api, owner.token);

    const requested = await requestLink(member, owner);
    expect(requested).toMatchObject({ linked: true, approval: 'pending', approved_at: null });
    expect(await settled(member)).toMatchObject({ approval: 'pending', inherited_keys: 0 });
    expect(await s.c.db('team_grants').where({ grantee_id: member.id })).toHaveLength(0);
    expect(await encryptStatus(member, key.fingerprint)).toBe(404);

    // The source lists the request (the grantee's side is its status).
    const incoming = await links(owner);
    expect(incoming).toMatchObject({
      total: 1,
      items: [{ grantee: { user_id: member.id }, source: { user_id: owner.id }, approval: 'pending', approved_at: null }],
    });
    expect(await eventTypes(owner)).toContain('team_links.requested');
    expect(await s.c.db('audit_logs').where({ user_id: owner.id, action: 'team_links.request', target: member.id })).toHaveLength(1);

    const approved = await approve(member, owner);
    expect(approved).toMatchObject({ grantee: { user_id: member.id }, approval: 'approved', approved_by_user_id: owner.id });
    expect(await settled(member)).toMatchObject({ state: 'ok', approval: 'approved', inherited_keys: 1 });
    expect(await encryptStatus(member, key.fingerprint)).toBe(202);
    expect((await links(owner, '?approval=approved')).total).toBe(1);
    expect((await links(owner, '?approval=pending')).total).toBe(0);
    expect(await eventTypes(member)).toContain('team_links.approved');
    expect(await s.c.db('audit_logs').where({ action: 'team_links.approve' }).whereIn('user_id', [owner.id, member.id])).toHaveLength(2);
    // Approving again changes nothing.
    await approve(member, owner);
    expect(await s.c.db('audit_logs').where({ action: 'team_links.approve' }).whereIn('user_id', [owner.id, member.id])).toHaveLength(2);
  });

  it('counts a grant only for an approved link, whatever rows exist', async () => {
    const [owner, member] = await team(2);
    const key = await createKey(s.api, owner.token);
    await requestLink(member, owner);
    await settled(member);
    await s.c.db('team_grants').insert({ grantee_id: member.id, lineage_id: key.lineage_id, source_id: owner.id });
    expect(await encryptStatus(member, key.fingerprint)).toBe(404);
    expect((await status(member)).inherited_keys).toBe(0);
  });

  it('lets only the source, or a manager above it, approve; never the grantee; the approval names the source', async () => {
    const [owner, admin, member, other] = await team(4, ['admin', 'member', 'member']);
    await createKey(s.api, owner.token);
    const approveAs = (by: User, grantee: User, sourceId: string) =>
      s.api('POST', `/team-access/links/${grantee.id}/approve`, { token: by.token, body: { source_user_id: sourceId } });

    // A plain member links to the owner: only the owner approves.
    await requestLink(member, owner);
    expect((await approveAs(member, member, owner.id)).body.code).toBe('team_link_not_found');
    expect((await approveAs(other, member, owner.id)).status).toBe(404);
    expect([(await approveAs(admin, member, owner.id)).status, (await approveAs(admin, member, owner.id)).body.code]).toEqual([
      403,
      'organization_owner_required',
    ]);
    expect((await s.api('POST', `/team-access/links/${member.id}/approve`, { token: owner.apiKey, body: { source_user_id: owner.id } })).status).toBe(403);
    expect((await status(member)).approval).toBe('pending');

    // An admin approves a link to a plain member, and lists the organization's links.
    await requestLink(other, member);
    expect((await links(member)).total).toBe(1);
    const byMember = await s.api('GET', '/team-access/links?view=organization', { token: other.token });
    expect([byMember.status, byMember.body.code]).toEqual([403, 'organization_admin_required']);
    const org = await links(admin, '?view=organization');
    expect(org.items.map((l: any) => [l.grantee.user_id, l.source.user_id, l.approval]).sort()).toEqual(
      [
        [member.id, owner.id, 'pending'],
        [other.id, member.id, 'pending'],
      ].sort(),
    );
    // The grantee changed its source since: the approval of the old one is refused.
    await requestLink(other, admin);
    expect([(await approveAs(admin, other, member.id)).status, (await approveAs(admin, other, member.id)).body.code]).toEqual([409, 'team_link_changed']);
    await requestLink(other, member);
    expect((await approveAs(admin, other, member.id)).status).toBe(200);
    expect(await settled(other)).toMatchObject({ approval: 'approved' });

    // A change of source asks again.
    await requestLink(other, owner);
    expect(await settled(other)).toMatchObject({ approval: 'pending', inherited_keys: 0 });
  });

  it('approves once under parallel approvals, and a change of source racing an approval never inherits the approval', async () => {
    const [owner, member, other] = await team(3);
    await requestLink(member, owner);
    const answers = await Promise.all(
      Array.from({ length: 5 }, () => s.api('POST', `/team-access/links/${member.id}/approve`, { token: owner.token, body: { source_user_id: owner.id } })),
    );
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 200, 200]);
    expect(await s.c.db('audit_logs').where({ user_id: owner.id, action: 'team_links.approve' })).toHaveLength(1);

    await requestLink(other, owner);
    const [approval, change] = await Promise.all([
      s.api('POST', `/team-access/links/${other.id}/approve`, { token: owner.token, body: { source_user_id: owner.id } }),
      s.api('POST', '/team-access/link', { token: other.token, body: { source_user_id: member.id } }),
    ]);
    expect(change.status).toBe(200);
    expect([200, 409]).toContain(approval.status);
    // Whichever ran first, the link to the new source waits for the new source's approval.
    expect(await settled(other)).toMatchObject({ source_user_id: member.id, approval: 'pending', inherited_keys: 0 });
  });

  it('lets the source end a link: inherited access ends at once, both sides hear of it', async () => {
    const [owner, member] = await team(2);
    const key = await createKey(s.api, owner.token);
    await link(member, owner);
    expect(await encryptStatus(member, key.fingerprint)).toBe(202);

    const res = await s.api('DELETE', `/team-access/links/${member.id}`, { token: owner.token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toEqual({ grantee_user_id: member.id, source_user_id: owner.id, revoked_keys: 1 });
    expect(await encryptStatus(member, key.fingerprint)).toBe(404);
    expect(await status(member)).toMatchObject({ linked: false, inherited_keys: 0 });
    expect((await links(owner)).total).toBe(0);
    expect(await eventTypes(member)).toContain('team_links.unlinked');
    expect(await s.c.db('audit_logs').where({ user_id: member.id, action: 'team_links.unlink' }).pluck('details')).toEqual([
      expect.objectContaining({ reason: 'ended_by_source' }),
    ]);
    expect((await s.api('DELETE', `/team-access/links/${member.id}`, { token: owner.token })).status).toBe(404);
  });
});

describe('wrong passphrases on an inherited key', () => {
  it('spend the guesser’s own budget: the owner’s passphrase still works, and the owner hears of each guess', async () => {
    const [owner, member] = await team(2);
    const key = await createKey(s.api, owner.token);
    await link(member, owner);
    const job = await encrypt(s.api, owner.token, key.fingerprint, file());
    const ciphertext = await download(s.api, owner.token, job.job_id ?? job.id);
    const guess = 'Tr0ub4dor&3 is not it';
    const decrypt = (u: User, passphrase: string) =>
      s.api('POST', '/keys/decrypt', { token: u.token, form: { fingerprint: key.fingerprint, passphrase, files: [{ name: 'n.gpg', data: ciphertext }] } });

    for (let i = 0; i < 10; i++) expect((await decrypt(member, guess)).body.code).toBe('wrong_passphrase');
    const refused = await decrypt(member, guess);
    expect([refused.status, refused.body.code]).toEqual([429, 'rate_limited']);

    const mine = await runJob(s.api, owner.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'n.gpg', data: ciphertext }],
    });
    expect(mine.state).toBe('completed');

    const rows = (await s.api('GET', '/audit-logs?action=keys.check_passphrase&page_size=100', { token: owner.token })).body.items;
    expect(rows).toHaveLength(10);
    expect(rows[0]).toMatchObject({
      status: 'failure',
      target: key.fingerprint,
      details: { caller_user_id: member.id, lineage_id: key.lineage_id, action: 'keys.decrypt' },
    });
    const events = (await s.api('GET', '/events/history?types=keys.passphrase_failed', { token: owner.token })).body.items;
    expect(events.length).toBe(10);
    expect(events[0].data).toMatchObject({ lineage_id: key.lineage_id, fingerprint: key.fingerprint, caller_user_id: member.id });
    expect(JSON.stringify([rows, events, await s.c.db('audit_logs')])).not.toContain(guess);
    // The guesser's own failures stay in its own log; none of them reach its events as the owner's.
    expect(await eventTypes(member)).not.toContain('keys.passphrase_failed');
  });

  it('tells the owner of wrong guesses on its own key too', async () => {
    const [owner] = await team(1);
    const key = await createKey(s.api, owner.token);
    const job = await encrypt(s.api, owner.token, key.fingerprint, file());
    const ciphertext = await download(s.api, owner.token, job.job_id ?? job.id);
    const res = await s.api('POST', '/keys/decrypt', {
      token: owner.token,
      form: { fingerprint: key.fingerprint, passphrase: 'wrong one', files: [{ name: 'n.gpg', data: ciphertext }] },
    });
    expect(res.body.code).toBe('wrong_passphrase');
    expect(await s.c.db('audit_logs').where({ user_id: owner.id, action: 'keys.check_passphrase' }).pluck('details')).toEqual([
      expect.objectContaining({ caller_user_id: owner.id }),
    ]);
  });
});
