import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFile } from 'node:fs/promises';
import * as openpgp from 'openpgp';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, download, runJob } from '../support/keys';
import { createPgpHome, plaintextForGpg, type PgpHome } from '../support/gpg';

/**
 * POST /keys/import with keys made by GnuPG 2.2, Sequoia (sq 0.27) and OpenPGP.js: what imports, what
 * the imported keys then do (decrypt what gpg encrypted to them; a recipient key encrypts but never
 * decrypts or signs), and a 422 for each kind of key we would not generate.
 */
let s: TestService;
let home: PgpHome;
let u: Awaited<ReturnType<typeof registerUser>>;
const GPG_PASS = 'the passphrase gpg locked it with';
const plain = plaintextForGpg(1 << 20);

beforeAll(async () => {
  s = await startTestService();
  home = await createPgpHome();
  u = await registerUser(s.api);
});
afterAll(async () => {
  await s?.stop();
  await home?.cleanup();
});

const importKey = (key: string | Buffer, fields: Record<string, string> = {}, token = u.token) =>
  s.api('POST', '/keys/import', {
    token,
    form: { label: 'imported', passphrase: PASSPHRASE, ...fields, key: typeof key === 'string' ? key : { name: 'key.gpg', data: key } },
  });

/** A gpg secret key of `algo` (a --quick-gen-key algorithm), exported as gpg exports it. */
async function gpgKey(
  uid: string,
  algo: string,
  opts: { armor?: boolean; extra?: string[] } = {},
): Promise<{ fingerprint: string; secret: Buffer; public: string }> {
  await home.gpg([...(opts.extra ?? []), '--quick-generate-key', uid, algo, 'default', 'never'], { passphrase: GPG_PASS });
  const listing = (await home.gpg(['--with-colons', '--list-keys', uid])).stdout.toString();
  const fingerprint = /^fpr:+([0-9A-F]{40}):/m.exec(listing)![1].toLowerCase();
  // An algorithm named alone makes a primary key only: RSA keys get their encryption subkey as gpg users add one.
  if (algo.startsWith('rsa')) await home.gpg([...(opts.extra ?? []), '--quick-add-key', fingerprint, algo, 'encr', 'never'], { passphrase: GPG_PASS });
  const secret = (await home.gpg(['--export-secret-keys', ...(opts.armor === false ? [] : ['--armor']), fingerprint], { passphrase: GPG_PASS })).stdout;
  return { fingerprint, secret, public: (await home.gpg(['--export', '--armor', fingerprint])).stdout.toString() };
}

describe('secret keys from gpg and sq', () => {
  it.each([
    ['ed25519/cv25519', 'future-default', 'curve25519', true],
    ['RSA 3072, binary export', 'rsa3072', 'rsa3072', false],
    ['RSA 4096', 'rsa4096', 'rsa4096', true],
  ] as const)(
    'a gpg %s key imports, and decrypts what gpg encrypts to it',
    async (_name, algo, algorithm, armor) => {
      const uid = `Gpg ${algo} <gpg-${algo}@example.test>`;
      const key = await gpgKey(uid, algo, { armor });
      const res = await importKey(key.secret, { key_passphrase: GPG_PASS, label: `gpg-${algo}` });
      expect(res.status, JSON.stringify(res.body)).toBe(201);
      expect(res.body).toMatchObject({ fingerprint: key.fingerprint, kind: 'managed', imported: true, algorithm, generation: 1, uid });

      const plainPath = await home.put(`plain-${algo}.bin`, plain);
      const encrypted = home.file(`to-${algo}.gpg`);
      await home.gpg(['--encrypt', '-r', key.fingerprint, '-o', encrypted, plainPath]);
      const job = await runJob(s.api, u.token, '/keys/decrypt', {
        fingerprint: key.fingerprint,
        passphrase: PASSPHRASE,
        files: [{ name: 'in.gpg', data: await readFile(encrypted) }],
      });
      expect(job.state, JSON.stringify(job.error)).toBe('completed');
      expect(Buffer.compare(await download(s.api, u.token, job.job_id), plain)).toBe(0);

      // The original passphrase opens nothing here: only the new one does.
      const wrong = await s.api('POST', '/keys/decrypt', {
        token: u.token,
        form: { fingerprint: key.fingerprint, passphrase: GPG_PASS, files: [{ name: 'in.gpg', data: Buffer.from('x') }] },
      });
      expect([wrong.status, wrong.body.code]).toEqual([422, 'wrong_passphrase']);
    },
    120_000,
  );

  it('an sq key imports (unprotected), and decrypts what sq encrypts to it', async () => {
    const keyPath = home.file('sq-import.pgp');
    await home.sq(['key', 'generate', '--userid', 'Sq Import <sq-import@example.test>', '--export', keyPath]);
    const res = await importKey(await readFile(keyPath), { label: 'from-sq' });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    expect(res.body).toMatchObject({ kind: 'managed', imported: true });
    const cert = home.file('sq-import.cert');
    await home.sq(['key', 'extract-cert', '-o', cert, keyPath]);
    const encrypted = home.file('to-sq-import.pgp');
    await home.sq(['encrypt', '--recipient-cert', cert, '-o', encrypted, await home.put('plain-sq.bin', plain)]);
    const job = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: res.body.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'in.pgp', data: await readFile(encrypted) }],
    });
    expect(job.state, JSON.stringify(job.error)).toBe('completed');
    expect(Buffer.compare(await download(s.api, u.token, job.job_id), plain)).toBe(0);
  }, 60_000);

  it('rotating an imported key adds a generated generation', async () => {
    const key = await gpgKey('Rotated Import <rot-import@example.test>', 'future-default');
    const res = await importKey(key.secret, { key_passphrase: GPG_PASS, label: 'rot-import' });
    expect(res.status).toBe(201);
    const rotated = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
    expect(rotated.body.state, JSON.stringify(rotated.body)).toBe('completed');
    const list = await s.api('GET', '/keys/list?label=rot-import', { token: u.token });
    expect(list.body.items[0]).toMatchObject({ generation: 2, imported: false, kind: 'managed', uid: 'Rotated Import <rot-import@example.test>' });
  }, 60_000);

  it('refuses a wrong or missing key passphrase, and a secret key without a new passphrase', async () => {
    const key = await gpgKey('Locked <locked@example.test>', 'future-default');
    const wrong = await importKey(key.secret, { key_passphrase: 'not the passphrase' });
    expect([wrong.status, wrong.body.code]).toEqual([422, 'wrong_key_passphrase']);
    const missing = await importKey(key.secret);
    expect([missing.status, missing.body.code]).toEqual([422, 'key_passphrase_required']);
    const noNew = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'x', key_passphrase: GPG_PASS, key: key.secret.toString() } });
    expect([noNew.status, noNew.body.code]).toEqual([422, 'passphrase_required']);
    const again = await importKey(key.secret, { key_passphrase: GPG_PASS });
    expect(again.status).toBe(201);
    const twice = await importKey(key.secret, { key_passphrase: GPG_PASS });
    expect([twice.status, twice.body.code]).toEqual([409, 'key_exists']);
    // The audit log names the refusals, never a passphrase or the key.
    const rows = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.import' }).select('status', 'details');
    expect(rows.map((r) => r.details.reason).filter(Boolean)).toEqual(
      expect.arrayContaining(['wrong_key_passphrase', 'key_passphrase_required', 'passphrase_required', 'key_exists']),
    );
    expect(JSON.stringify(rows)).not.toContain(GPG_PASS);
  }, 60_000);
});

describe('public keys become recipient keys', () => {
  it('encrypts to it and lists it as a recipient key; decrypt, sign and rotate are refused', async () => {
    const key = await gpgKey('Partner <partner@example.test>', 'future-default');
    const res = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'partner', key: key.public } });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    expect(res.body).toMatchObject({ fingerprint: key.fingerprint, kind: 'recipient', imported: true });

    const enc = await runJob(s.api, u.token, '/keys/encrypt', { fingerprint: key.fingerprint, files: [{ name: 'for-partner.bin', data: plain }] });
    expect(enc.state).toBe('completed');
    const out = home.file('from-service-partner.bin');
    await home.gpg(['--decrypt', '-o', out, await home.put('for-partner.gpg', await download(s.api, u.token, enc.job_id))], { passphrase: GPG_PASS });
    expect(Buffer.compare(await readFile(out), plain)).toBe(0);

    const before = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.decrypt' }).count<{ count: string }[]>('* as count');
    for (const path of ['/keys/decrypt', '/keys/sign'] as const) {
      const refused = await s.api('POST', path, {
        token: u.token,
        form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f', data: Buffer.from('x') }] },
      });
      expect([refused.status, refused.body.code]).toEqual([409, 'recipient_key']);
    }
    const rotate = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {} });
    expect([rotate.status, rotate.body.code]).toEqual([409, 'recipient_key']);
    // No passphrase was checked: nothing counted as a wrong guess.
    const after = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.decrypt' }).count<{ count: string }[]>('* as count');
    expect(after[0].count).toBe(before[0].count);
    const list = await s.api('GET', '/keys/list?label=partner', { token: u.token });
    expect(list.body.items[0]).toMatchObject({ kind: 'recipient', imported: true });
  }, 60_000);
});

describe('keys we would not generate are refused (422)', () => {
  it('RSA under 2048 bits', async () => {
    const key = await gpgKey('Small <small@example.test>', 'rsa1024');
    const res = await importKey(key.secret, { key_passphrase: GPG_PASS });
    expect([res.status, res.body.code]).toEqual([422, 'weak_key_algorithm']);
  }, 60_000);

  it('DSA/ElGamal', async () => {
    const key = await gpgKey('Dsa <dsa@example.test>', 'dsa2048');
    await home.gpg(['--quick-add-key', key.fingerprint, 'elg2048', 'encr', 'never'], { passphrase: GPG_PASS });
    const res = await s.api('POST', '/keys/import', {
      token: u.token,
      form: { label: 'dsa', key: (await home.gpg(['--export', '--armor', key.fingerprint])).stdout.toString() },
    });
    expect([res.status, res.body.code]).toEqual([422, 'weak_key_algorithm']);
  }, 60_000);

  it('only SHA-1 self-signatures', async () => {
    const key = await gpgKey('Sha1 <sha1@example.test>', 'rsa2048', { extra: ['--cert-digest-algo', 'SHA1', '--digest-algo', 'SHA1'] });
    const res = await importKey(key.secret, { key_passphrase: GPG_PASS });
    expect([res.status, res.body.code], JSON.stringify(res.body)).toEqual([422, 'weak_self_signature']);
  }, 60_000);

  it('revoked', async () => {
    const { privateKey } = await openpgp.generateKey({ userIDs: [{ email: 'revoked@example.test' }], format: 'object' });
    const { privateKey: revoked } = await openpgp.revokeKey({ key: privateKey, format: 'armored' });
    const res = await importKey(revoked);
    expect([res.status, res.body.code]).toEqual([422, 'key_revoked']);
  });

  it('expired', async () => {
    const { privateKey } = await openpgp.generateKey({
      userIDs: [{ email: 'expired@example.test' }],
      date: new Date(Date.now() - 10 * 86_400_000),
      keyExpirationTime: 86_400,
      format: 'armored',
    });
    const res = await importKey(privateKey);
    expect([res.status, res.body.code]).toEqual([422, 'key_expired']);
  });

  it('a secret key that does not match its public part', async () => {
    const a = (await openpgp.generateKey({ userIDs: [{ email: 'a@example.test' }], format: 'object' })).privateKey;
    const b = (await openpgp.generateKey({ userIDs: [{ email: 'b@example.test' }], format: 'object' })).privateKey;
    // A's public subkey (and its binding), with B's secret for it.
    const packet = a.subkeys[0].keyPacket as unknown as { privateParams: unknown };
    packet.privateParams = (b.subkeys[0].keyPacket as unknown as { privateParams: unknown }).privateParams;
    const res = await importKey(a.armor());
    expect([res.status, res.body.code]).toEqual([422, 'key_mismatch']);
  });

  it('hostile keys fail fast: 10,000 subkeys, a 1 MiB user id, garbage', async () => {
    const { publicKey } = await openpgp.generateKey({ userIDs: [{ email: 'base@example.test' }], format: 'object' });
    const packets = publicKey.toPacketList().write();
    const subkey = Buffer.from(
      packets.subarray(packets.length - (publicKey.subkeys[0].keyPacket.write().length + 2 + publicKey.subkeys[0].bindingSignatures[0].write().length + 2)),
    );
    const many = Buffer.concat([packets, ...Array.from({ length: 10_000 }, () => subkey)]).subarray(0, (1 << 20) - 1);
    const t0 = Date.now();
    const res = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'many', key: { name: 'many.gpg', data: many } } });
    expect([res.status, res.body.code]).toEqual([422, 'invalid_key']);
    // A key packet, then a user id packet of ~1 MiB (5-octet length).
    const keyBody = publicKey.keyPacket.write();
    const uidBody = Buffer.alloc((1 << 20) - 4096, 0x41);
    const uidHeader = Buffer.alloc(6);
    uidHeader.writeUInt8(0xcd, 0);
    uidHeader.writeUInt8(0xff, 1);
    uidHeader.writeUInt32BE(uidBody.length, 2);
    const longUid = Buffer.concat([Buffer.from([0xc6, keyBody.length]), keyBody, uidHeader, uidBody]);
    const uid = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'uid', key: { name: 'uid.gpg', data: longUid } } });
    expect([uid.status, uid.body.code]).toEqual([422, 'invalid_key']);
    const garbage = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'garbage', key: 'not a key at all' } });
    expect([garbage.status, garbage.body.code]).toEqual([422, 'invalid_key']);
    expect(Date.now() - t0).toBeLessThan(30_000);
  }, 60_000);
});

describe('ownership', () => {
  it("another account's imported key is not found (404), and the caller's audit trail does not say it exists", async () => {
    const key = await gpgKey('Owned <owned@example.test>', 'future-default');
    expect((await importKey(key.secret, { key_passphrase: GPG_PASS, label: 'owned' })).status).toBe(201);
    const other = await registerUser(s.api);
    const res = await s.api('POST', '/keys/sign', {
      token: other.token,
      form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f', data: Buffer.from('x') }] },
    });
    expect([res.status, res.body.code]).toEqual([404, 'key_not_found']);
    expect(await s.c.db('audit_logs').where({ user_id: other.id, action: 'keys.deny_access' })).toHaveLength(0);
  }, 60_000);
});
