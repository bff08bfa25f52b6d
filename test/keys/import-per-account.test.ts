import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import * as openpgp from 'openpgp';
import { startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';
import { teamHelpers, type User } from '../support/teams';
import { startSmtpServer } from '../support/smtp';
import { destroyDueGenerations } from '../../lib/lifecycle/key-lifecycle';

/**
 * Imports are per account: any number of accounts hold the same public key, the owner imports its
 * secret key whoever holds the public one, each copy lives on its own, and no answer (nor the caller's
 * own audit trail) tells one account what another holds. Within one account a key is held once; the
 * secret key of a recipient key the account holds upgrades that key.
 */
let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;
const DAY = 86_400_000;

beforeAll(async () => {
  smtp = await startSmtpServer();
  s = await startTestService({ env: { SMTP_URL: smtp.url } });
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

const { newUser, team, link, settled } = teamHelpers(() => ({ s, smtp }));

/** A key pair made elsewhere (the owner's): the unprotected secret key and the public key it publishes. */
async function ownersKey(email: string) {
  const { privateKey, publicKey } = await openpgp.generateKey({ userIDs: [{ name: 'Owner', email }], format: 'object' });
  return { fingerprint: privateKey.getFingerprint(), secret: privateKey.armor(), public: publicKey.armor() };
}

const importKey = (u: User, key: string, label = 'imported', extra: Record<string, string> = {}) =>
  s.api('POST', '/keys/import', { token: u.token, form: { label, key, ...extra } });
const importSecret = (u: User, key: string, label = 'mine') => importKey(u, key, label, { passphrase: PASSPHRASE });

const plain = () => randomBytes(2048);
const decrypt = (u: User, fingerprint: string, data: Buffer, passphrase = PASSPHRASE) =>
  runJob(s.api, u.token, '/keys/decrypt', { fingerprint, passphrase, files: [{ name: 'f.gpg', data }] });
const encryptStatus = async (u: User, fingerprint: string) =>
  (await s.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint, files: [{ name: 'x', data: plain() }] }, headers: { prefer: 'wait=30' } }))
    .status;
const withClockAdvanced = async <T>(ms: number, fn: () => Promise<T>): Promise<T> => {
  const clock = s.c.clock as ManualClockFollowingTime;
  clock.advance(ms);
  try {
    return await fn();
  } finally {
    clock.advance(-ms);
  }
};

describe('the same key in several accounts', () => {
  it('another account imports the public key of a key this account holds: 201, a recipient key of its own', async () => {
    const [a, b] = [await newUser(), await newUser()];
    const key = await ownersKey('a@example.test');
    const mine = await importSecret(a, key.secret);
    expect(mine.status, JSON.stringify(mine.body)).toBe(201);
    const theirs = await importKey(b, key.public, 'partner a');
    expect(theirs.status, JSON.stringify(theirs.body)).toBe(201);
    expect(theirs.body).toMatchObject({ fingerprint: key.fingerprint, kind: 'recipient', label: 'partner a' });
    expect(theirs.body.lineage_id).not.toBe(mine.body.lineage_id);
    // Each account sees its own copy.
    const seenBy = async (u: User) => (await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: key.fingerprint } })).body.key;
    expect(await seenBy(a)).toMatchObject({ lineage_id: mine.body.lineage_id, kind: 'managed' });
    expect(await seenBy(b)).toMatchObject({ lineage_id: theirs.body.lineage_id, kind: 'recipient' });
  });

  it('whoever imports a published public key first does not block its owner: the owner imports the secret key, 201', async () => {
    const [squatter, owner] = [await newUser(), await newUser()];
    const key = await ownersKey('owner@example.test');
    expect((await importKey(squatter, key.public, 'squatted')).status).toBe(201);
    const res = await importSecret(owner, key.secret);
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    expect(res.body).toMatchObject({ fingerprint: key.fingerprint, kind: 'managed', imported: true });
    // The owner's key decrypts what the squatter's copy encrypts.
    const data = plain();
    const enc = await encrypt(s.api, squatter.token, key.fingerprint, [{ name: 'for-owner', data }]);
    const dec = await decrypt(owner, key.fingerprint, await download(s.api, squatter.token, enc.job_id));
    expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
    expect(Buffer.compare(await download(s.api, owner.token, dec.job_id), data)).toBe(0);
  });

  it('each copy is used and managed on its own: encrypt, decrypt, shares, disable, destroy', async () => {
    const [a, b, c] = [await newUser(), await newUser(), await newUser()];
    const key = await ownersKey('three@example.test');
    expect((await importSecret(a, key.secret, 'a-own')).status).toBe(201);
    expect((await importKey(b, key.public, 'b-copy')).status).toBe(201);
    expect((await importKey(c, key.public, 'c-copy')).status).toBe(201);

    // B's copy encrypts; it never reaches A's private key.
    const data = plain();
    const enc = await encrypt(s.api, b.token, key.fingerprint, [{ name: 'n', data }]);
    const ct = await download(s.api, b.token, enc.job_id);
    const refused = await s.api('POST', '/keys/decrypt', {
      token: b.token,
      form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f', data: ct }] },
    });
    expect([refused.status, refused.body.code]).toEqual([409, 'recipient_key']);
    expect((await decrypt(a, key.fingerprint, ct)).state).toBe('completed');

    // Shares serve the sharer's own copy.
    const share = async (u: User) => (await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint } })).body;
    const [shareA, shareB] = [await share(a), await share(b)];
    const view = (token: string) => s.api('GET', `/keys/share/${token}`);
    expect((await view(shareA.share_token)).body).toMatchObject({ fingerprint: key.fingerprint, label: 'a-own' });
    expect((await view(shareB.share_token)).body).toMatchObject({ fingerprint: key.fingerprint, label: 'b-copy' });
    const listed = async (u: User) => (await s.api('GET', `/keys/share/?fingerprint=${key.fingerprint}`, { token: u.token })).body.items;
    expect((await listed(a)).map((i: { share_id: string }) => i.share_id)).toEqual([shareA.share_id]);

    // B disables its copy: A's key and C's copy still encrypt.
    expect((await s.api('POST', '/keys/disable-key', { token: b.token, body: { fingerprint: key.fingerprint } })).status).toBe(200);
    expect(await encryptStatus(b, key.fingerprint)).toBe(409);
    expect(await encryptStatus(a, key.fingerprint)).toBe(200);
    expect(await encryptStatus(c, key.fingerprint)).toBe(200);

    // B destroys its copy: gone for B (its share answers 410), nothing changes for A or C.
    const destroy = await s.api('POST', `/keys/${key.fingerprint}/destruction`, { token: b.token, body: { waiting_days: 7 } });
    expect(destroy.status, JSON.stringify(destroy.body)).toBe(202);
    await withClockAdvanced(8 * DAY, async () => expect((await destroyDueGenerations(s.c)).destroyed).toBeGreaterThanOrEqual(1));
    expect((await view(shareB.share_token)).body.code).toBe('key_destroyed');
    expect((await view(shareA.share_token)).status).toBe(200);
    const generations = async (u: User) => (await s.api('GET', `/keys/${key.fingerprint}/generations`, { token: u.token })).body;
    expect((await generations(b)).destroyed_at).not.toBeNull();
    expect((await generations(a)).items[0]).toMatchObject({ status: 'current', destroyed_at: null });
    const again = await encrypt(s.api, a.token, key.fingerprint, [{ name: 'n', data }]);
    const dec = await decrypt(a, key.fingerprint, await download(s.api, a.token, again.job_id));
    expect(Buffer.compare(await download(s.api, a.token, dec.job_id), data)).toBe(0);

    // A disables its key: C's copy still encrypts.
    expect((await s.api('POST', '/keys/disable-key', { token: a.token, body: { fingerprint: key.fingerprint } })).status).toBe(200);
    expect(await encryptStatus(a, key.fingerprint)).toBe(409);
    expect(await encryptStatus(c, key.fingerprint)).toBe(200);
  }, 60_000);

  it('no answer, nor the caller’s own audit trail, tells an account that another holds a fingerprint', async () => {
    const [a, b, probe] = [await newUser(), await newUser(), await newUser()];
    const held = await ownersKey('held@example.test');
    expect((await importSecret(a, held.secret)).status).toBe(201);
    expect((await importKey(b, held.public)).status).toBe(201);
    const nowhere = (await ownersKey('nowhere@example.test')).fingerprint;

    const file = [{ name: 'f', data: Buffer.from('x') }];
    const asks: [string, string, (fpr: string) => { body?: unknown; form?: Record<string, string | typeof file> }][] = [
      ['POST', '/keys/get-public-key', (fingerprint) => ({ body: { fingerprint } })],
      ['POST', '/keys/disable-key', (fingerprint) => ({ body: { fingerprint } })],
      ['POST', '/keys/share/create', (fingerprint) => ({ body: { fingerprint } })],
      ['GET', '/keys/share/?fingerprint=', () => ({})],
      ['GET', '/keys/{fp}/generations', () => ({})],
      ['GET', '/keys/{fp}/rotation-history', () => ({})],
      ['POST', '/keys/{fp}/rotate', () => ({ body: {} })],
      ['POST', '/keys/{fp}/rotation-schedule', () => ({ body: { rotation_interval_days: 30 } })],
      ['POST', '/keys/{fp}/destruction', () => ({ body: {} })],
      ['POST', '/keys/encrypt', (fingerprint) => ({ form: { fingerprint, files: file } })],
      ['POST', '/keys/decrypt', (fingerprint) => ({ form: { fingerprint, passphrase: PASSPHRASE, files: file } })],
      ['POST', '/keys/sign', (fingerprint) => ({ form: { fingerprint, passphrase: PASSPHRASE, files: file } })],
      ['POST', '/keys/verify', (fingerprint) => ({ form: { fingerprint, files: file, signatures: file } })],
    ];
    const answer = async (fingerprint: string) => {
      const out = [];
      for (const [method, path, opts] of asks) {
        const url = path.replace('{fp}', fingerprint) + (path.endsWith('=') ? fingerprint : '');
        const res = await s.api(method, url, { token: probe.token, ...opts(fingerprint) });
        const { request_id: _id, ...body } = res.body as Record<string, unknown>;
        out.push({ path, status: res.status, body: JSON.stringify(body).replaceAll(fingerprint, 'FPR') });
      }
      return out;
    };
    const audit = async (fingerprint: string) =>
      (await s.c.db('audit_logs').where({ user_id: probe.id, target: fingerprint }).orderBy('id').select('action', 'status', 'details')).map((r) =>
        JSON.stringify(r).replaceAll(fingerprint, 'FPR'),
      );
    const forHeld = await answer(held.fingerprint);
    expect(forHeld.every((r) => r.status === 404)).toBe(true);
    expect(forHeld).toEqual(await answer(nowhere));
    expect(await audit(held.fingerprint)).toEqual(await audit(nowhere));

    // Importing it answers as for a key nobody holds.
    const res = await importKey(probe, held.public, 'probe');
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({ fingerprint: held.fingerprint, kind: 'recipient', imported: true, status: 'active' });
  });
});

describe('the same key twice in one account', () => {
  it('is 409 key_exists: a key again, a public key after its secret key, and one generated here', async () => {
    const u = await newUser();
    const pub = await ownersKey('twice-public@example.test');
    expect((await importKey(u, pub.public)).status).toBe(201);
    const again = await importKey(u, pub.public);
    expect([again.status, again.body.code]).toEqual([409, 'key_exists']);
    expect(again.body.detail).toContain('This account already holds this key');

    const sec = await ownersKey('twice-secret@example.test');
    expect((await importSecret(u, sec.secret)).status).toBe(201);
    for (const res of [await importSecret(u, sec.secret), await importKey(u, sec.public)]) expect([res.status, res.body.code]).toEqual([409, 'key_exists']);

    // Concurrent imports of one key: one stores it.
    const race = await ownersKey('race@example.test');
    const answers = await Promise.all([importKey(u, race.public), importKey(u, race.public), importKey(u, race.public)]);
    expect(answers.map((r) => r.status).sort()).toEqual([201, 409, 409]);
    expect(await s.c.db('pgp_keys').where({ user_id: u.id, fingerprint: race.fingerprint }).count<{ n: number }[]>({ n: '*' })).toEqual([{ n: 1 }]);

    // The fingerprint index holds it within the account.
    const { id: _id, ...row } = await s.c.db('pgp_keys').where({ user_id: u.id, fingerprint: sec.fingerprint }).first();
    await expect(s.c.db('pgp_keys').insert({ ...row, generation: 2, status: 'rotated' })).rejects.toThrow(/pgp_keys_account_fingerprint/);
  });

  it("the secret key of the account's recipient key upgrades it: the same key (200), now managed; its shares stay", async () => {
    const u = await newUser();
    const key = await ownersKey('upgrade@example.test');
    const recipient = await importKey(u, key.public, 'partner');
    expect(recipient.status).toBe(201);
    const share = await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint } });
    const data = plain();
    const ct = await download(s.api, u.token, (await encrypt(s.api, u.token, key.fingerprint, [{ name: 'n', data }])).job_id);

    const noPassphrase = await importKey(u, key.secret);
    expect([noPassphrase.status, noPassphrase.body.code]).toEqual([422, 'passphrase_required']);
    const upgraded = await importSecret(u, key.secret, 'now mine');
    expect(upgraded.status, JSON.stringify(upgraded.body)).toBe(200);
    expect(upgraded.body).toMatchObject({
      lineage_id: recipient.body.lineage_id,
      fingerprint: key.fingerprint,
      kind: 'managed',
      label: 'now mine',
      generation: 1,
    });
    const dec = await decrypt(u, key.fingerprint, ct);
    expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
    expect(Buffer.compare(await download(s.api, u.token, dec.job_id), data)).toBe(0);
    expect((await s.api('GET', `/keys/share/${share.body.share_token}`)).body).toMatchObject({ fingerprint: key.fingerprint, label: 'now mine' });
    const audit = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.import', target: key.fingerprint, status: 'success' }).orderBy('id');
    expect(audit.map((r) => r.details.kind)).toEqual(['recipient', 'managed']);
    expect(audit[1].details.upgraded).toBe('recipient');

    // Once managed, the secret key again is 409; so is a recipient key whose destruction is scheduled.
    const twice = await importSecret(u, key.secret);
    expect([twice.status, twice.body.code]).toEqual([409, 'key_exists']);
    const doomed = await ownersKey('doomed@example.test');
    expect((await importKey(u, doomed.public)).status).toBe(201);
    expect((await s.api('POST', `/keys/${doomed.fingerprint}/destruction`, { token: u.token, body: {} })).status).toBe(202);
    const refused = await importSecret(u, doomed.secret);
    expect([refused.status, refused.body.code]).toEqual([409, 'key_exists']);
    expect(refused.body.detail).toContain('scheduled for destruction');
  });

  it('two upgrades of one recipient key at once: one upgrades it, the other is 409', async () => {
    const u = await newUser();
    const key = await ownersKey('upgrade-race@example.test');
    expect((await importKey(u, key.public)).status).toBe(201);
    const answers = await Promise.all([importSecret(u, key.secret), importSecret(u, key.secret)]);
    expect(answers.map((r) => r.status).sort()).toEqual([200, 409]);
    const lineages = await s.c.db('key_lineages').where({ user_id: u.id });
    expect(lineages.map((l) => l.kind)).toEqual(['managed']);
  });
});

describe('team access and administrators', () => {
  it("a teammate's own copy comes first; decrypt and sign take the granted key that holds the private key; managing stays with the own copy", async () => {
    const [source, member] = await team(2);
    const key = await ownersKey('team@example.test');
    const managed = await importSecret(source, key.secret, 'source key');
    expect(managed.status).toBe(201);
    const copy = await importKey(member, key.public, 'member copy');
    expect(copy.status).toBe(201);
    await link(member, source);

    const got = await s.api('POST', '/keys/get-public-key', { token: member.token, body: { fingerprint: key.fingerprint } });
    expect(got.body.key).toMatchObject({ lineage_id: copy.body.lineage_id, kind: 'recipient' });
    const data = plain();
    const enc = await encrypt(s.api, member.token, key.fingerprint, [{ name: 'n', data }]);
    const used = await s.c.db('pgp_keys').where({ fingerprint: key.fingerprint }).select('user_id', 'encrypt_files');
    expect(Object.fromEntries(used.map((r) => [r.user_id, Number(r.encrypt_files)]))).toEqual({ [member.id]: 1, [source.id]: 0 });

    // Decrypt needs a private key: the source's, with its passphrase.
    const dec = await decrypt(member, key.fingerprint, await download(s.api, member.token, enc.job_id));
    expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
    expect(Buffer.compare(await download(s.api, member.token, dec.job_id), data)).toBe(0);
    const signed = await runJob(s.api, member.token, '/keys/sign', { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'n', data }] });
    expect(signed.state, JSON.stringify(signed.error)).toBe('completed');

    // Rotating is the owner's: the member's own recipient copy answers.
    const rotate = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: member.token, body: {} });
    expect([rotate.status, rotate.body.code]).toEqual([409, 'recipient_key']);
    // A key the member only sees through team access: managing it is 404, audited as not_owner (the
    // member can list that key: the row tells it nothing new).
    const granted = await createKey(s.api, source.token, { label: 'granted only' });
    await settled(member);
    const disable = await s.api('POST', '/keys/disable-key', { token: member.token, body: { fingerprint: granted.fingerprint } });
    expect([disable.status, disable.body.code]).toEqual([404, 'key_not_found']);
    const denied = await s.c.db('audit_logs').where({ user_id: member.id, action: 'keys.deny_access' }).select('target', 'details');
    expect(denied).toEqual([{ target: granted.fingerprint, details: { reason: 'not_owner' } }]);
  }, 60_000);

  it('administrators name a fingerprint that several accounts hold by lineage id (409 ambiguous_key); metrics count each copy alone', async () => {
    const admin = await newUser();
    await s.c.db('users').where({ id: admin.id }).update({ role: 'admin' });
    const [a, b] = [await newUser(), await newUser()];
    const key = await ownersKey('admin@example.test');
    const mine = (await importSecret(a, key.secret)).body;
    const theirs = (await importKey(b, key.public)).body;
    await encrypt(s.api, b.token, key.fingerprint, [{ name: 'n', data: plain() }]);
    await encrypt(s.api, b.token, key.fingerprint, [{ name: 'n', data: plain() }]);
    await encrypt(s.api, a.token, key.fingerprint, [{ name: 'n', data: plain() }]);

    const ambiguous = await s.api('GET', `/keys/health?key_id=${key.fingerprint}`, { token: admin.token });
    expect([ambiguous.status, ambiguous.body.code]).toEqual([409, 'ambiguous_key']);
    expect(ambiguous.body.detail).toContain(mine.lineage_id);
    expect(ambiguous.body.detail).toContain(theirs.lineage_id);
    expect((await s.api('GET', `/keys/health?key_id=${mine.lineage_id}`, { token: admin.token })).body).toMatchObject({ account: a.id });
    const metrics = async (id: string) => (await s.api('GET', `/keys/${id}/metrics`, { token: admin.token })).body;
    const encrypts = (m: { operations: { action: string; status: string; count: number }[] }) =>
      m.operations.find((o) => o.action === 'keys.encrypt' && o.status === 'success')?.count;
    expect(encrypts(await metrics(mine.lineage_id))).toBe(1);
    expect(encrypts(await metrics(theirs.lineage_id))).toBe(2);
  });
});
