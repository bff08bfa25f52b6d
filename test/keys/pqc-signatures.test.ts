import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import * as proton from '@protontech/openpgp';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, runJob } from '../support/keys';

/**
 * Post-quantum keys (RFC 9980: ML-DSA-65+Ed25519 primary, ML-KEM-768+X25519 subkey) in signing,
 * verification and import, against Proton's OpenPGP.js both ways: the service's detached signatures
 * (binary and armored) verify there; Proton's verify here (valid, bad_signature, unknown_signer); a
 * Proton secret key imports with its passphrase, then decrypts what Proton encrypts to it and signs
 * what Proton verifies. Signed messages by a post-quantum key are refused by name.
 */
let s: TestService;
let u: Awaited<ReturnType<typeof registerUser>>;
let ours: { fingerprint: string };
let oursPublic: proton.PublicKey;
const data = randomBytes(300_000);

beforeAll(async () => {
  s = await startTestService({ roles: ['web', 'worker'] });
  u = await registerUser(s.api);
  ours = await createKey(s.api, u.token, { label: 'pqc-signer', profile: 'pqc' });
  const pub = await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: ours.fingerprint } });
  oursPublic = await proton.readKey({ armoredKey: pub.body.public_key as string });
}, 60_000);
afterAll(async () => {
  await s?.stop();
});

async function sign(fingerprint: string, fields: Record<string, string> = {}) {
  const job = await runJob(s.api, u.token, '/keys/sign', { fingerprint, passphrase: PASSPHRASE, ...fields, files: [{ name: 'd.bin', data }] });
  expect(job.state, JSON.stringify(job.error)).toBe('completed');
  return { job, output: await download(s.api, u.token, job.job_id) };
}

async function verify(fingerprint: string, signature: Uint8Array, file = data) {
  const job = await runJob(s.api, u.token, '/keys/verify', {
    fingerprint,
    files: [{ name: 'd.bin', data: file }],
    signatures: [{ name: 'd.sig', data: Buffer.from(signature) }],
  });
  expect(job.state, JSON.stringify(job.error)).toBe('completed');
  return job.result.signatures[0] as { valid: boolean; signer_fingerprint: string | null; signed_at: string | null; reason: string | null };
}

async function protonVerifies(key: proton.PublicKey, signature: proton.Signature): Promise<boolean> {
  const { signatures } = await proton.verify({ message: await proton.createMessage({ binary: data }), signature, verificationKeys: key, expectSigned: true });
  return signatures[0].verified;
}

const protonKey = (name: string, passphrase?: string, config: proton.PartialConfig = {}) =>
  proton.generateKey({
    type: 'pqc',
    userIDs: [{ name, email: `${name.toLowerCase()}@example.test` }],
    config: { v6Keys: true, ...config },
    passphrase,
    format: 'object',
  });

describe("the service's post-quantum signatures", () => {
  it('a detached binary and an armored signature verify in Proton, and here', async () => {
    const binary = await sign(ours.fingerprint);
    expect(binary.job.result.files[0].name).toBe('d.bin.sig');
    expect(await protonVerifies(oursPublic, await proton.readSignature({ binarySignature: new Uint8Array(binary.output) }))).toBe(true);
    const armored = await sign(ours.fingerprint, { armor: 'true' });
    expect(armored.job.result.files[0].name).toBe('d.bin.asc');
    const text = armored.output.toString();
    expect(text.startsWith('-----BEGIN PGP SIGNATURE-----\n')).toBe(true);
    expect(await protonVerifies(oursPublic, await proton.readSignature({ armoredSignature: text }))).toBe(true);

    for (const signature of [binary.output, armored.output]) {
      const check = await verify(ours.fingerprint, signature);
      expect(check).toMatchObject({ valid: true, signer_fingerprint: ours.fingerprint, reason: null });
      expect(Date.parse(check.signed_at!)).toBeGreaterThan(Date.now() - 120_000);
    }
  });

  it('a signed message, or sign-then-encrypt, is refused with the alternative named', async () => {
    const job = await runJob(s.api, u.token, '/keys/sign', {
      fingerprint: ours.fingerprint,
      passphrase: PASSPHRASE,
      detached: 'false',
      files: [{ name: 'd.bin', data }],
    });
    expect(job).toMatchObject({ state: 'failed', error: { code: 'signed_message_unsupported' } });
    expect(job.error.message).toMatch(/detached/);
    const recipient = await createKey(s.api, u.token, { label: 'v4-recipient' });
    const encrypted = await runJob(s.api, u.token, '/keys/encrypt', {
      fingerprint: recipient.fingerprint,
      sign_with: ours.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'd.bin', data }],
    });
    expect(encrypted).toMatchObject({ state: 'failed', error: { code: 'signed_message_unsupported' } });
  });
});

describe("Proton's post-quantum signatures, verified here", () => {
  let theirs: Awaited<ReturnType<typeof protonKey>>;
  let imported: string;
  let signature: Uint8Array;
  beforeAll(async () => {
    theirs = await protonKey('Proton');
    const res = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'proton-pqc', key: theirs.publicKey.armor() } });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    expect(res.body).toMatchObject({ kind: 'recipient', profile: 'pqc', algorithm: 'ml-kem-768+x25519', fingerprint: theirs.publicKey.getFingerprint() });
    imported = res.body.fingerprint as string;
    signature = await proton.sign({ message: await proton.createMessage({ binary: data }), signingKeys: theirs.privateKey, detached: true, format: 'binary' });
  }, 60_000);

  it('a good signature is valid and names the signer', async () => {
    expect(imported).toMatch(/^[0-9a-f]{64}$/);
    expect(await verify(imported, signature)).toMatchObject({ valid: true, signer_fingerprint: imported, reason: null });
    // Supplied with the request rather than imported: the same verdict.
    const job = await runJob(s.api, u.token, '/keys/verify', {
      public_key: theirs.publicKey.armor(),
      files: [{ name: 'd.bin', data }],
      signatures: [{ name: 'd.asc', data: Buffer.from(proton.armor(proton.enums.armor.signature, signature)) }],
    });
    expect(job.state, JSON.stringify(job.error)).toBe('completed');
    expect(job.result.signatures[0]).toMatchObject({ valid: true, signer_fingerprint: imported });
  });

  it('changed data or a changed signature is bad_signature; another key is unknown_signer', async () => {
    const changed = Buffer.from(data);
    changed[1234] ^= 1;
    expect(await verify(imported, signature, changed)).toMatchObject({ valid: false, reason: 'bad_signature', signer_fingerprint: imported });
    const tampered = Buffer.from(signature);
    tampered[tampered.length - 100] ^= 1; // in the ML-DSA-65 half
    expect(await verify(imported, tampered)).toMatchObject({ valid: false, reason: 'bad_signature' });
    expect(await verify(ours.fingerprint, signature)).toMatchObject({ valid: false, reason: 'unknown_signer', signer_fingerprint: null });
  });

  it('a file with a v4 and a post-quantum signature is valid by either key', async () => {
    const v4 = await createKey(s.api, u.token, { label: 'v4-signer' });
    const v4Signature = (await sign(v4.fingerprint)).output;
    const both = Buffer.concat([v4Signature, Buffer.from(signature)]);
    expect(await verify(imported, both)).toMatchObject({ valid: true, signer_fingerprint: imported });
    expect(await verify(v4.fingerprint, both)).toMatchObject({ valid: true, signer_fingerprint: v4.fingerprint });
  });
});

describe('post-quantum keys that are refused', () => {
  it('a changed self-signature, a secret key as a recipient, an expired key', async () => {
    const theirs = await protonKey('Refused');
    const bytes = Buffer.from(theirs.publicKey.write());
    bytes[bytes.length - 50] ^= 1; // in the subkey binding's ML-DSA-65 signature
    const broken = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'broken', key: { name: 'k.gpg', data: bytes } } });
    expect(broken.body).toMatchObject({ code: 'invalid_key' });
    const secretAsSigner = await s.api('POST', '/keys/verify', {
      token: u.token,
      form: { public_key: theirs.privateKey.armor(), files: [{ name: 'd.bin', data }], signatures: [{ name: 'd.sig', data: Buffer.from('x') }] },
    });
    expect(secretAsSigner.body).toMatchObject({ code: 'private_key_supplied' });
    const old = await proton.generateKey({
      type: 'pqc',
      userIDs: [{ name: 'Old' }],
      config: { v6Keys: true },
      date: new Date(Date.now() - 3 * 86_400_000),
      keyExpirationTime: 86_400,
      format: 'object',
    });
    const expired = await s.api('POST', '/keys/import', { token: u.token, form: { label: 'expired', key: old.publicKey.armor() } });
    expect(expired.body).toMatchObject({ code: 'key_expired' });
  });
});

describe('a Proton post-quantum secret key, imported', () => {
  const importSecret = (key: Uint8Array | string, keyPassphrase: string, label: string) =>
    s.api('POST', '/keys/import', {
      token: u.token,
      form: { label, passphrase: PASSPHRASE, key_passphrase: keyPassphrase, key: typeof key === 'string' ? key : { name: 'key.gpg', data: Buffer.from(key) } },
    });

  it.each([
    ['iterated S2K, CFB (armored)', {}, true],
    ['iterated S2K, AEAD (binary)', { aeadProtect: true }, false],
    [
      'Argon2, AEAD (armored)',
      { aeadProtect: true, s2kType: proton.enums.s2k.argon2, s2kArgon2Params: { passes: 3, parallelism: 4, memoryExponent: 16 } },
      true,
    ],
  ] as const)(
    'locked with %s, imports with its passphrase (not another) as a managed post-quantum key',
    async (_lock, config, armored) => {
      const theirs = await protonKey('Locked', 'their passphrase', config);
      const key = armored ? theirs.privateKey.armor() : theirs.privateKey.write();
      expect((await importSecret(key, 'not it', 'pqc-wrong')).body).toMatchObject({ code: 'wrong_key_passphrase' });
      const res = await importSecret(key, 'their passphrase', 'pqc-locked');
      expect(res.status, JSON.stringify(res.body)).toBe(201);
      expect(res.body).toMatchObject({ kind: 'managed', profile: 'pqc', algorithm: 'ml-kem-768+x25519', fingerprint: theirs.publicKey.getFingerprint() });
    },
    60_000,
  );

  it('an Argon2 lock costlier than the service spends is refused by name', async () => {
    const theirs = await protonKey('Costly', 'pw', {
      aeadProtect: true,
      s2kType: proton.enums.s2k.argon2,
      s2kArgon2Params: { passes: 1, parallelism: 4, memoryExponent: 17 },
    });
    expect((await importSecret(theirs.privateKey.armor(), 'pw', 'pqc-costly')).body).toMatchObject({ code: 'key_protection_too_costly' });
  }, 60_000);

  it('decrypts what Proton encrypts to it, and signs what Proton verifies', async () => {
    // aeadProtect: features that say SEIPDv2, so Proton writes PKESK v6 to the ML-KEM subkey (with v6Keys alone it writes PKESK v3 + SEIPDv1).
    const theirs = await protonKey('Importer', 'their passphrase', { aeadProtect: true });
    const res = await importSecret(theirs.privateKey.armor(), 'their passphrase', 'pqc-secret');
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    const fingerprint = res.body.fingerprint as string;

    const message = await proton.encrypt({ message: await proton.createMessage({ binary: data }), encryptionKeys: theirs.publicKey, format: 'binary' });
    const decrypted = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'm.gpg', data: Buffer.from(message) }],
    });
    expect(decrypted.state, JSON.stringify(decrypted.error)).toBe('completed');
    expect(Buffer.compare(await download(s.api, u.token, decrypted.job_id), data)).toBe(0);

    const { output } = await sign(fingerprint);
    expect(await protonVerifies(theirs.publicKey, await proton.readSignature({ binarySignature: new Uint8Array(output) }))).toBe(true);
  }, 60_000);
});
