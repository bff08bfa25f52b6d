import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import * as openpgp from 'openpgp';
import { GENERATION_S2K_COUNT_BYTE, generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { randomSecret, openSealedSecret } from '../../lib/lineage';
import { unlockLineage } from '../../lib/keys/key-catalog';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';
import type { KeyRow, LineageRow } from '../../db/keys';

/**
 * Generation keys are locked without key stretching (the secret is 256 random bits): new keys carry the
 * smallest iterated S2K count; keys locked the old way (count byte 224, 16 MiB hashed) still open; a
 * tampered lock never yields a key.
 */

/** Count bytes of the S2K specifiers of every secret key packet (primary and subkeys). */
function s2kCounts(key: openpgp.PrivateKey): number[] {
  return key
    .getKeys()
    .map((k) => (k.keyPacket as unknown as { s2k: { type: string; c: number } }).s2k)
    .map((s) => (s.type === 'iterated' ? s.c : -1));
}

/** What generateKey wrote before this change: the same key, locked at OpenPGP.js's default count (224). */
async function oldLock(armored: string, secret: string): Promise<string> {
  const open = await unlockPrivateKey(armored, secret);
  return (await openpgp.encryptKey({ privateKey: open, passphrase: secret, config: { s2kIterationCountByte: 224 } })).armor();
}

/** Flips one bit near the end of the secret subkey packet: inside its encrypted secret material and checksum. */
async function flipLastByte(armored: string): Promise<string> {
  const { data } = await openpgp.unarmor(armored);
  const bytes = new Uint8Array(await new Response(data).arrayBuffer());
  const sub = (await openpgp.readPrivateKey({ binaryKey: bytes })).subkeys[0].keyPacket.write();
  const at = Buffer.from(bytes).indexOf(Buffer.from(sub));
  expect(at).toBeGreaterThan(0);
  bytes[at + sub.length - 3] ^= 0x01;
  return openpgp.armor(openpgp.enums.armor.privateKey, bytes);
}

async function encryptTo(publicArmored: string, data: Uint8Array): Promise<Uint8Array> {
  const message = await openpgp.createMessage({ binary: data });
  return openpgp.encrypt({ message, encryptionKeys: await readStoredPublicKey(publicArmored), format: 'binary' });
}

async function decryptWith(privateKey: openpgp.PrivateKey, ciphertext: Uint8Array): Promise<Uint8Array> {
  const message = await openpgp.readMessage({ binaryMessage: ciphertext });
  return (await openpgp.decrypt({ message, decryptionKeys: privateKey, format: 'binary' })).data;
}

describe('generation key lock (in process)', () => {
  const secret = randomSecret();
  let key: Awaited<ReturnType<typeof generateKey>>;
  beforeAll(async () => {
    key = await generateKey({ name: 'G', email: 'g@example.test', algorithm: 'curve25519', secret });
  });

  it('locks new keys at the smallest S2K count, still a passphrase-protected OpenPGP key', async () => {
    const locked = await openpgp.readPrivateKey({ armoredKey: key.privateArmored });
    expect(locked.isDecrypted()).toBe(false);
    expect(s2kCounts(locked)).toEqual([GENERATION_S2K_COUNT_BYTE, GENERATION_S2K_COUNT_BYTE]);
    const open = await unlockPrivateKey(key.privateArmored, secret);
    const data = randomBytes(500);
    expect(Buffer.from(await decryptWith(open, await encryptTo(key.publicArmored, data))).equals(data)).toBe(true);
    await expect(unlockPrivateKey(key.privateArmored, randomSecret())).rejects.toMatchObject({ code: 'wrong_passphrase' });
  });

  it('still opens a key locked the old way (count byte 224), with the same identity', async () => {
    const old = await oldLock(key.privateArmored, secret);
    expect(s2kCounts(await openpgp.readPrivateKey({ armoredKey: old }))).toEqual([224, 224]);
    const open = await unlockPrivateKey(old, secret);
    expect(open.getFingerprint()).toBe(key.fingerprint);
    const data = randomBytes(500);
    expect(Buffer.from(await decryptWith(open, await encryptTo(key.publicArmored, data))).equals(data)).toBe(true);
    await expect(unlockPrivateKey(old, 'not the secret')).rejects.toMatchObject({ code: 'wrong_passphrase' });
  });

  it('refuses a tampered lock: flipped secret material, a swapped public point, truncation', async () => {
    await expect(unlockPrivateKey(await flipLastByte(key.privateArmored), secret)).rejects.toThrow();

    // Key overwriting: another key's public parameters under our encrypted secret (primary, then subkey).
    const other = await generateKey({ name: 'O', email: 'o@example.test', algorithm: 'curve25519', secret });
    for (const pick of [(k: openpgp.PrivateKey) => k.keyPacket, (k: openpgp.PrivateKey) => k.subkeys[0].keyPacket]) {
      const ours = await openpgp.readPrivateKey({ armoredKey: key.privateArmored });
      const theirs = await openpgp.readPrivateKey({ armoredKey: other.privateArmored });
      (pick(ours) as unknown as { publicParams: unknown }).publicParams = (pick(theirs) as unknown as { publicParams: unknown }).publicParams;
      await expect(unlockPrivateKey(ours.armor(), secret)).rejects.toThrow();
    }

    const lines = key.privateArmored.trim().split('\n');
    await expect(unlockPrivateKey([...lines.slice(0, 4), ...lines.slice(-1)].join('\n'), secret)).rejects.toThrow();
  });
});

describe('generation key lock (stored rows)', () => {
  let s: TestService;
  let u: Awaited<ReturnType<typeof registerUser>>;
  beforeAll(async () => {
    s = await startTestService();
    u = await registerUser(s.api);
  });
  afterAll(async () => {
    await s?.stop();
  });

  // The row bindings of lib/keys/key-catalog.ts (`aad`): the stored values are sealed to their row.
  const privateAad = (k: KeyRow) => `pgp-private:${k.lineage_id}:${k.generation}`;
  const secretAad = (k: KeyRow) => `pgp-secret:${k.lineage_id}:${k.generation}`;
  const row = (fingerprint: string) => s.c.db<KeyRow>('pgp_keys').where({ fingerprint }).first() as Promise<KeyRow>;

  async function roundTrip(fingerprint: string, data: Buffer) {
    const enc = await encrypt(s.api, u.token, fingerprint, [{ name: 'f.bin', data }]);
    const ciphertext = await download(s.api, u.token, enc.job_id);
    return runJob(s.api, u.token, '/keys/decrypt', { fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f.bin.gpg', data: ciphertext }] });
  }

  it('a generation stored the old way still decrypts, and a rotation writes the new lock', async () => {
    const key = await createKey(s.api, u.token);
    const k = await row(key.fingerprint);
    const lineage = (await s.c.db<LineageRow>('key_lineages').where({ id: k.lineage_id }).first())!;
    const unlock = await unlockLineage(s.c, lineage, PASSPHRASE);
    const secret = openSealedSecret(unlock, s.c.sealer.openText(k.secret_sealed, secretAad(k)), secretAad(k));
    const stored = s.c.sealer.openText(k.private_sealed, privateAad(k));
    expect(s2kCounts(await openpgp.readPrivateKey({ armoredKey: stored }))).toEqual([0, 0]);
    // Rewrite the row as the previous code stored it: same key, locked at count byte 224.
    await s.c
      .db('pgp_keys')
      .where({ id: k.id })
      .update({ private_sealed: s.c.sealer.seal(await oldLock(stored, secret), privateAad(k)) });

    const data = randomBytes(3000);
    const dec = await roundTrip(key.fingerprint, data);
    expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
    expect((await download(s.api, u.token, dec.job_id)).equals(data)).toBe(true);

    const rotated = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
    expect(rotated.status, JSON.stringify(rotated.body)).toBe(200);
    const next = await row(rotated.body.result.new_fingerprint);
    expect(s2kCounts(await openpgp.readPrivateKey({ armoredKey: s.c.sealer.openText(next.private_sealed, privateAad(next)) }))).toEqual([0, 0]);
    const again = await roundTrip(next.fingerprint, data);
    expect(again.state, JSON.stringify(again.error)).toBe('completed');
    expect((await download(s.api, u.token, again.job_id)).equals(data)).toBe(true);
    // The old generation (now rotated, still old-format) keeps decrypting what was sent to it.
    const old = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'f.bin.gpg', data: Buffer.from(await encryptTo(k.public_armored, data)) }],
    });
    expect(old.state, JSON.stringify(old.error)).toBe('completed');
  });

  it('a tampered stored lock or sealed secret fails the decrypt job, with no output', async () => {
    const key = await createKey(s.api, u.token, { label: 'tamper' });
    const k = await row(key.fingerprint);
    const data = randomBytes(1000);
    const ciphertext = Buffer.from(await encryptTo(k.public_armored, data));
    const decrypt = () =>
      runJob(s.api, u.token, '/keys/decrypt', { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f.bin.gpg', data: ciphertext }] });

    // The lock itself altered (as if sealed by the service): OpenPGP's checksum refuses it.
    const flipped = await flipLastByte(s.c.sealer.openText(k.private_sealed, privateAad(k)));
    await s.c
      .db('pgp_keys')
      .where({ id: k.id })
      .update({ private_sealed: s.c.sealer.seal(flipped, privateAad(k)) });
    const first = await decrypt();
    expect(first.state).toBe('failed');
    expect(first.result).toBeNull();
    expect((await s.api('GET', `/jobs/${first.job_id}/files/0`, { token: u.token })).status).not.toBe(200);

    // The sealed secret changed under the master-key seal: refused before any key is opened.
    await s.c.db('pgp_keys').where({ id: k.id }).update({ private_sealed: k.private_sealed });
    const sealed = Buffer.from(k.secret_sealed);
    sealed[sealed.length - 2] = sealed[sealed.length - 2] === 0x41 ? 0x42 : 0x41;
    await s.c.db('pgp_keys').where({ id: k.id }).update({ secret_sealed: sealed.toString() });
    const second = await decrypt();
    expect(second.state).toBe('failed');
    expect(second.result).toBeNull();
    expect((await s.api('GET', `/jobs/${second.job_id}/files/0`, { token: u.token })).status).not.toBe(200);

    // Restored, it decrypts again (the failures were the tampering, nothing else).
    await s.c.db('pgp_keys').where({ id: k.id }).update({ secret_sealed: k.secret_sealed });
    const ok = await decrypt();
    expect(ok.state, JSON.stringify(ok.error)).toBe('completed');
    expect((await download(s.api, u.token, ok.job_id)).equals(data)).toBe(true);
  });
});
