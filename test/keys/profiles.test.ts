import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import * as openpgp from 'openpgp';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';

/**
 * Key profiles through the API: a key is made v4 (`rfc4880`, the default) or v6 (`rfc9580`, `pqc`); its
 * views say which; files to a v6 generation are SEIPDv2; a rotation moves a lineage to another profile
 * (and its later rotations follow), and rewrap brings old files along. Refusals name the field.
 */
let s: TestService;
let u: Awaited<ReturnType<typeof registerUser>>;

beforeAll(async () => {
  s = await startTestService({ roles: ['web', 'worker'] });
  u = await registerUser(s.api);
});
afterAll(async () => {
  await s?.stop();
});

/** Tag and first body octet (its version, for key, session-key and encrypted-data packets) of each packet. */
function packetVersions(msg: Buffer): { tag: number; version: number }[] {
  const out: { tag: number; version: number }[] = [];
  let i = 0;
  while (i < msg.length) {
    const c = msg[i++];
    if (!(c & 0x40)) throw new Error('legacy packet format');
    const tag = c & 0x3f;
    let first = true;
    for (;;) {
      const f = msg[i++];
      const [n, partial] =
        f < 192
          ? [f, false]
          : f < 224
            ? [((f - 192) << 8) + msg[i++] + 192, false]
            : f === 255
              ? [msg.readUInt32BE((i += 4) - 4), false]
              : [2 ** (f & 0x1f), true];
      if (first) out.push({ tag, version: msg[i] });
      first = false;
      i += n;
      if (!partial) break;
    }
  }
  return out;
}

async function publicKey(fingerprint: string) {
  const res = await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint } });
  return openpgp.readKey({ armoredKey: res.body.public_key as string });
}

async function rotate(fingerprint: string, body: Record<string, string> = {}) {
  const res = await s.api('POST', `/keys/${fingerprint}/rotate`, { token: u.token, body, headers: { prefer: 'wait=30' } });
  expect(res.body.state, JSON.stringify(res.body)).toBe('completed');
  return res.body.result.new_fingerprint as string;
}

async function decrypt(fingerprint: string, data: Buffer) {
  const job = await runJob(s.api, u.token, '/keys/decrypt', { fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f.gpg', data }] });
  expect(job.state, JSON.stringify(job.error)).toBe('completed');
  return download(s.api, u.token, job.job_id);
}

describe('generating by profile', () => {
  it('makes v4 keys by default and v6 keys for rfc9580; each view names its profile', async () => {
    const v4 = await createKey(s.api, u.token, { label: 'classic' });
    expect(v4).toMatchObject({ profile: 'rfc4880', rotation_profile: 'rfc4880', algorithm: 'curve25519' });
    expect(v4.fingerprint).toMatch(/^[0-9a-f]{40}$/);
    expect((await publicKey(v4.fingerprint)).keyPacket.version).toBe(4);

    const v6 = await createKey(s.api, u.token, { label: 'modern', profile: 'rfc9580' });
    expect(v6).toMatchObject({ profile: 'rfc9580', rotation_profile: 'rfc9580', algorithm: 'curve25519' });
    expect(v6.fingerprint).toMatch(/^[0-9a-f]{64}$/);
    const key = await publicKey(v6.fingerprint);
    expect(key.keyPacket.version).toBe(6);
    expect(key.getFingerprint()).toBe(v6.fingerprint);
    const listed = (await s.api('GET', '/keys/list?label=modern', { token: u.token })).body.items;
    expect(listed[0]).toMatchObject({ fingerprint: v6.fingerprint, profile: 'rfc9580' });

    // A fingerprint of either length names the key in paths, as gpg prints it (groups, any case).
    const spaced = v6.fingerprint.toUpperCase().replace(/(.{4})/g, '$1 ');
    const byPath = await s.api('GET', `/keys/${encodeURIComponent(spaced)}/rotation-history`, { token: u.token });
    expect(byPath.status).toBe(200);
  });

  it('encrypts files to a v6 key as SEIPDv2 (PKESK v6), and decrypts them', async () => {
    const key = await createKey(s.api, u.token, { label: 'aead', profile: 'rfc9580' });
    const data = randomBytes(300_000);
    const job = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'a.bin', data }]);
    const ciphertext = await download(s.api, u.token, job.job_id);
    expect(packetVersions(ciphertext)).toEqual([
      { tag: 1, version: 6 },
      { tag: 18, version: 2 },
    ]);
    expect(Buffer.compare(await decrypt(key.fingerprint, ciphertext), data)).toBe(0);
  });

  it('refuses an algorithm the profile does not make, an unknown profile, and names the field', async () => {
    const form = { label: 'x', environment: 'production', name: 'X', email: 'x@example.test', passphrase: PASSPHRASE };
    const rsa = await s.api('POST', '/keys/generate-key', { token: u.token, form: { ...form, profile: 'rfc9580', algorithm: 'rsa4096' } });
    expect(rsa.status).toBe(422);
    expect(rsa.body.errors).toEqual([expect.objectContaining({ path: 'body.algorithm' })]);
    const unknown = await s.api('POST', '/keys/generate-key', { token: u.token, form: { ...form, profile: 'rfc2440' } });
    expect(unknown.status).toBe(422);
    expect(unknown.body.errors).toEqual([expect.objectContaining({ path: 'body.profile' })]);
  });
});

describe('moving a lineage to another profile', () => {
  it('rotates a v4 lineage to v6; old files rewrap to SEIPDv2 and decrypt; later rotations stay v6', async () => {
    const key = await createKey(s.api, u.token, { label: 'moving' });
    const data = randomBytes(120_000);
    const old = await download(s.api, u.token, (await encrypt(s.api, u.token, key.fingerprint, [{ name: 'old.bin', data }])).job_id);
    expect(packetVersions(old).map((p) => p.version)).toEqual([3, 1]);

    const gen2 = await rotate(key.fingerprint, { profile: 'rfc9580' });
    expect(gen2).toMatch(/^[0-9a-f]{64}$/);
    const listed = (await s.api('GET', '/keys/list?label=moving', { token: u.token })).body.items[0];
    expect(listed).toMatchObject({ fingerprint: gen2, generation: 2, profile: 'rfc9580', rotation_profile: 'rfc9580' });

    const job = await runJob(s.api, u.token, '/keys/rewrap', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'old.bin.gpg', data: old }],
    });
    expect(job.state, JSON.stringify(job.error)).toBe('completed');
    expect(job.result).toMatchObject({ mode: 'reencrypt', fingerprint_used: gen2 });
    const moved = await download(s.api, u.token, job.job_id);
    expect(packetVersions(moved).map((p) => p.version)).toEqual([6, 2]);
    expect(Buffer.compare(await decrypt(gen2, moved), data)).toBe(0);
    expect(Buffer.compare(await decrypt(key.fingerprint, old), data)).toBe(0); // generation 1 still opens its files

    const gen3 = await rotate(gen2);
    expect((await publicKey(gen3)).keyPacket.version).toBe(6);
    const generations = await s.api('GET', `/keys/${gen3}/generations`, { token: u.token });
    expect(generations.body.items.map((g: { profile: string }) => g.profile)).toEqual(['rfc9580', 'rfc9580', 'rfc4880']); // newest first
    const share = await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: gen3 } });
    const shared = await s.api('GET', `/keys/share/${share.body.share_token as string}`);
    expect(shared.body).toMatchObject({ fingerprint: gen3, profile: 'rfc9580' });
    const audit = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.rotate', target: key.fingerprint }).first();
    expect(audit.details).toMatchObject({ profile: 'rfc9580', generation: 2 });
  });

  it('keeps a default profile for scheduled rotations; refuses unknown fields by name', async () => {
    const key = await createKey(s.api, u.token, { label: 'scheduled' });
    const set = await s.api('POST', `/keys/${key.fingerprint}/rotation-schedule`, { token: u.token, body: { profile: 'rfc9580' } });
    expect(set.status, JSON.stringify(set.body)).toBe(200);
    expect(set.body).toMatchObject({ profile: 'rfc9580', mode: 'policy' });
    const both = await s.api('POST', `/keys/${key.fingerprint}/rotation-schedule`, {
      token: u.token,
      body: { rotation_interval_days: 30, profile: 'rfc4880' },
    });
    expect(both.body).toMatchObject({ profile: 'rfc4880', mode: 'interval', rotation_interval_days: 30 });
    await s.api('POST', `/keys/${key.fingerprint}/rotation-schedule`, { token: u.token, body: { profile: 'rfc9580' } });
    expect((await s.api('GET', '/keys/list?label=scheduled', { token: u.token })).body.items[0]).toMatchObject({
      profile: 'rfc4880',
      rotation_profile: 'rfc9580',
      rotation_mode: 'interval',
    });
    expect((await publicKey(await rotate(key.fingerprint))).keyPacket.version).toBe(6);

    const wrong = await s.api('POST', `/keys/${key.fingerprint}/rotation-schedule`, { token: u.token, body: { interval: 30 } });
    expect(wrong.status).toBe(422);
    expect(JSON.stringify(wrong.body.errors)).toMatch(/interval/);
    const empty = await s.api('POST', `/keys/${key.fingerprint}/rotation-schedule`, { token: u.token, body: {} });
    expect(empty.status).toBe(422);
  });

  it('a lineage whose profile a database write downgraded is not rotated', async () => {
    const key = await createKey(s.api, u.token, { label: 'pinned', profile: 'rfc9580' });
    await s.c.db('key_lineages').where({ id: key.lineage_id }).update({ profile: 'rfc4880' });
    const res = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
    expect(res.status).toBe(500); // an IntegrityError: logged, never a silent use of the changed row (lib/integrity.ts)
    const generations = await s.c.db('pgp_keys').where({ lineage_id: key.lineage_id });
    expect(generations).toHaveLength(1);
    await s.c.db('key_lineages').where({ id: key.lineage_id }).update({ profile: 'rfc9580' });
  });
});

/**
 * The independent implementations: Proton's OpenPGP.js encrypts to the service's v6 key and the service
 * decrypts; the service encrypts to a v6 key the test holds the secret of (imported public key) and
 * Bouncy Castle (Java, as WebAssembly) and Proton decrypt it.
 */
describe('v6 keys with the independent implementations', () => {
  it("the service decrypts what Proton's OpenPGP.js encrypts to its v6 key", async () => {
    const proton = await import('@protontech/openpgp');
    const key = await createKey(s.api, u.token, { label: 'to-proton', profile: 'rfc9580' });
    const pub = await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: key.fingerprint } });
    const data = randomBytes(200_000);
    const message = await proton.encrypt({
      message: await proton.createMessage({ binary: data }),
      encryptionKeys: await proton.readKey({ armoredKey: pub.body.public_key as string }),
      format: 'binary',
    });
    expect(packetVersions(Buffer.from(message)).map((p) => p.version)).toEqual([6, 2]);
    expect(Buffer.compare(await decrypt(key.fingerprint, Buffer.from(message)), data)).toBe(0);
  });

  it('Bouncy Castle and Proton decrypt what the service encrypts to an imported v6 key', async () => {
    const proton = await import('@protontech/openpgp');
    const { decrypt: bcDecrypt } = await import('@renovatebot/pgp');
    const { privateKey, publicKey } = await proton.generateKey({
      type: 'curve25519',
      userIDs: [{ name: 'Partner', email: 'partner@example.test' }],
      config: { v6Keys: true, aeadProtect: true },
      format: 'armored',
    });
    const imported = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'partner-v6', key: publicKey } });
    expect(imported.status, JSON.stringify(imported.body)).toBe(201);
    expect(imported.body).toMatchObject({ profile: 'rfc9580', rotation_profile: 'rfc9580', kind: 'recipient' });
    const fingerprint = imported.body.fingerprint as string;
    const text = Buffer.from('a v6 message for Bouncy Castle\n'.repeat(1000));
    const job = await encrypt(s.api, u.token, fingerprint, [{ name: 'note.txt', data: text }], { armor: 'true' });
    const armored = (await download(s.api, u.token, job.job_id)).toString();
    expect(await bcDecrypt(privateKey, armored, { runtime: 'wasm-java' })).toBe(text.toString());
    const opened = await proton.decrypt({
      message: await proton.readMessage({ armoredMessage: armored }),
      decryptionKeys: await proton.readPrivateKey({ armoredKey: privateKey }),
      format: 'binary',
    });
    expect(Buffer.compare(Buffer.from(opened.data), text)).toBe(0);
  }, 60_000);

  it("signatures of a v6 key verify in Proton's OpenPGP.js, and Proton's verify here", async () => {
    const proton = await import('@protontech/openpgp');
    const key = await createKey(s.api, u.token, { label: 'v6-signer', profile: 'rfc9580' });
    const pub = await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: key.fingerprint } });
    const data = randomBytes(100_000);
    const signed = await runJob(s.api, u.token, '/keys/sign', { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'd.bin', data }] });
    expect(signed.state, JSON.stringify(signed.error)).toBe('completed');
    const signature = await download(s.api, u.token, signed.job_id);
    const checked = await proton.verify({
      message: await proton.createMessage({ binary: data }),
      signature: await proton.readSignature({ binarySignature: new Uint8Array(signature) }),
      verificationKeys: await proton.readKey({ armoredKey: pub.body.public_key as string }),
      expectSigned: true,
    });
    await expect(checked.signatures[0].verified).resolves.toBe(true);

    const theirs = await proton.generateKey({ type: 'curve25519', userIDs: [{ email: 'signer@example.test' }], config: { v6Keys: true }, format: 'object' });
    const imported = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'proton-signer', key: theirs.publicKey.armor() } });
    expect(imported.status, JSON.stringify(imported.body)).toBe(201);
    const theirSignature = await proton.sign({
      message: await proton.createMessage({ binary: data }),
      signingKeys: theirs.privateKey,
      detached: true,
      format: 'binary',
    });
    const verified = await runJob(s.api, u.token, '/keys/verify', {
      fingerprint: imported.body.fingerprint as string,
      files: [{ name: 'd.bin', data }],
      signatures: [{ name: 'd.sig', data: Buffer.from(theirSignature) }],
    });
    expect(verified.result.signatures[0]).toMatchObject({ valid: true, signer_fingerprint: imported.body.fingerprint });
  }, 60_000);

  it("the service decrypts what Proton's OpenPGP.js encrypts to its post-quantum key (ML-KEM-768+X25519), small and 64 MiB", async () => {
    const proton = await import('@protontech/openpgp');
    const key = await createKey(s.api, u.token, { label: 'pqc', profile: 'pqc' });
    expect(key).toMatchObject({ profile: 'pqc', algorithm: 'ml-kem-768+x25519' });
    const pub = await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: key.fingerprint } });
    const theirView = await proton.readKey({ armoredKey: pub.body.public_key as string });
    expect(theirView.getFingerprint()).toBe(key.fingerprint);
    expect(theirView.subkeys[0].getAlgorithmInfo().algorithm).toBe('pqc_mlkem_x25519');
    for (const size of [1, 150_000, 64 << 20]) {
      const data = randomBytes(size);
      const message = await proton.encrypt({ message: await proton.createMessage({ binary: data }), encryptionKeys: theirView, format: 'binary' });
      expect(Buffer.compare(await decrypt(key.fingerprint, Buffer.from(message)), data)).toBe(0);
    }
    // One changed octet of the ciphertext: one integrity error, no output.
    const message = Buffer.from(
      await proton.encrypt({ message: await proton.createMessage({ binary: randomBytes(5000) }), encryptionKeys: theirView, format: 'binary' }),
    );
    message[message.length - 100] ^= 1;
    const bad = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'bad.gpg', data: message }],
    });
    expect(bad).toMatchObject({ state: 'failed', error: { code: 'integrity_check_failed' } });
  }, 120_000);

  it('a v6 secret key imports (with its passphrase) as a managed key, decrypts what Proton encrypts to it and rotates as v6', async () => {
    const proton = await import('@protontech/openpgp');
    const { privateKey, publicKey: theirs } = await proton.generateKey({
      type: 'curve25519',
      userIDs: [{ name: 'Own', email: 'own@example.test' }],
      passphrase: 'their lock passphrase',
      config: { v6Keys: true, aeadProtect: true },
      format: 'object',
    });
    const imported = await s.api('POST', '/keys/import', {
      token: u.token,
      form: { label: 'own-v6', key: privateKey.armor(), key_passphrase: 'their lock passphrase', passphrase: PASSPHRASE },
    });
    expect(imported.status, JSON.stringify(imported.body)).toBe(201);
    expect(imported.body).toMatchObject({ kind: 'managed', profile: 'rfc9580', fingerprint: theirs.getFingerprint() });
    const data = randomBytes(40_000);
    const message = await proton.encrypt({ message: await proton.createMessage({ binary: data }), encryptionKeys: theirs, format: 'binary' });
    expect(Buffer.compare(await decrypt(imported.body.fingerprint as string, Buffer.from(message)), data)).toBe(0);
    expect((await publicKey(await rotate(imported.body.fingerprint as string))).keyPacket.version).toBe(6);
  });

  it("the service encrypts to post-quantum keys: its own (and decrypts), and Proton's (Proton decrypts), small and 64 MiB", async () => {
    const proton = await import('@protontech/openpgp');
    const own = await createKey(s.api, u.token, { label: 'pqc-own', profile: 'pqc' });
    const small = randomBytes(70_000);
    const toOwn = await download(s.api, u.token, (await encrypt(s.api, u.token, own.fingerprint, [{ name: 's.bin', data: small }])).job_id);
    expect(packetVersions(toOwn).map((p) => p.version)).toEqual([6, 2]);
    expect(Buffer.compare(await decrypt(own.fingerprint, toOwn), small)).toBe(0);

    const theirs = await proton.generateKey({
      type: 'pqc',
      userIDs: [{ email: 'pq@example.test' }],
      config: { v6Keys: true, aeadProtect: true },
      format: 'object',
    });
    const imported = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'proton-pqc', key: theirs.publicKey.armor() } });
    expect(imported.body).toMatchObject({ profile: 'pqc', kind: 'recipient' });
    const big = randomBytes(64 << 20);
    for (const data of [small, big]) {
      const job = await encrypt(s.api, u.token, imported.body.fingerprint as string, [{ name: 'b.bin', data }]);
      const message = await download(s.api, u.token, job.job_id);
      const opened = await proton.decrypt({
        message: await proton.readMessage({ binaryMessage: new Uint8Array(message) }),
        decryptionKeys: theirs.privateKey,
        format: 'binary',
      });
      expect(Buffer.compare(Buffer.from(opened.data), data)).toBe(0);
    }
  }, 120_000);

  it('a v4 lineage rotates to pqc; its old files rewrap to the post-quantum generation and decrypt', async () => {
    const key = await createKey(s.api, u.token, { label: 'to-pqc' });
    const data = randomBytes(90_000);
    const old = await download(s.api, u.token, (await encrypt(s.api, u.token, key.fingerprint, [{ name: 'o.bin', data }])).job_id);
    const next = await rotate(key.fingerprint, { profile: 'pqc' });
    const job = await runJob(s.api, u.token, '/keys/rewrap', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'o.bin.gpg', data: old }],
    });
    expect(job.result).toMatchObject({ mode: 'reencrypt', fingerprint_used: next });
    const moved = await download(s.api, u.token, job.job_id);
    expect(packetVersions(moved).map((p) => p.version)).toEqual([6, 2]);
    expect(Buffer.compare(await decrypt(next, moved), data)).toBe(0);
  });

  it('decrypts what Proton writes to a post-quantum key of its default config (features without SEIPDv2: PKESK v3 + SEIPDv1)', async () => {
    const proton = await import('@protontech/openpgp');
    const { privateKey, publicKey: theirs } = await proton.generateKey({
      type: 'pqc',
      userIDs: [{ email: 'v3@example.test' }],
      config: { v6Keys: true },
      format: 'object',
    });
    const imported = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'proton-pqc-v3', key: privateKey.armor(), passphrase: PASSPHRASE } });
    expect(imported.status, JSON.stringify(imported.body)).toBe(201);
    const data = randomBytes(30_000);
    const message = Buffer.from(await proton.encrypt({ message: await proton.createMessage({ binary: data }), encryptionKeys: theirs, format: 'binary' }));
    expect(packetVersions(message).map((p) => p.version)).toEqual([3, 1]);
    expect(Buffer.compare(await decrypt(imported.body.fingerprint as string, message), data)).toBe(0);
    message[message.length - 30] ^= 1;
    const bad = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: imported.body.fingerprint as string,
      passphrase: PASSPHRASE,
      files: [{ name: 'bad.gpg', data: message }],
    });
    expect(bad).toMatchObject({ state: 'failed', error: { code: 'integrity_check_failed' } });
  });
});
