import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import * as proton from '@protontech/openpgp';
import { decrypt as bouncyCastleDecrypt } from '@renovatebot/pgp';
import * as openpgp from 'openpgp';
import { beforeAll, describe, expect, it } from 'vitest';
import { encryptWith, messageFormat } from '../../lib/pgp/native';
import { encryptStream, openEncrypted } from '../../lib/pgp/stream';
import { generateKey, readStoredPublicKey } from '../../lib/pgp/keys';
import { packetBody } from '../support/tamper';

/**
 * SEIPDv2 (RFC 9580 §5.13.2) written on Node's crypto, with v6 session key packets, to v6 keys, read by
 * three independent implementations: OpenPGP.js (the service's library), Proton's OpenPGP.js fork and
 * Bouncy Castle (WebAssembly, decrypt only); and what the first two write to a v6 key, read here. The
 * 64 MiB runs are in seipd-v2-large.test.ts.
 */
const MiB = 1 << 20;
const user = { name: 'V6', email: 'v6@example.test' };
const v6Key = (aead: 'ocb' | 'gcm') =>
  openpgp
    .generateKey({
      type: 'curve25519',
      userIDs: [user],
      format: 'object',
      config: { v6Keys: true, aeadProtect: true, preferredAEADAlgorithm: openpgp.enums.aead[aead] },
    })
    .then((k) => k.privateKey);
const keys: Record<'ocb' | 'gcm', openpgp.PrivateKey> = {} as never;

beforeAll(async () => {
  keys.ocb = await v6Key('ocb');
  keys.gcm = await v6Key('gcm');
});

const source = (data: Buffer, chunk = 64 * 1024) =>
  Readable.from(
    (function* () {
      for (let i = 0; i < data.length; i += chunk) yield data.subarray(i, i + chunk);
    })(),
  );

const ourEncrypt = async (data: Buffer, key: openpgp.PublicKey, opts: { armor?: boolean; compress?: boolean } = {}) =>
  buffer(await encryptStream(source(data), key, { armor: opts.armor ?? false, compress: opts.compress, filename: 'v6.bin' }));

async function ourDecrypt(message: Buffer | Uint8Array | string, key: openpgp.PrivateKey) {
  const opened = await openEncrypted(source(Buffer.from(message), 100_000), { maxDecompressedBytes: 64 * MiB });
  const out = await opened.decrypt(key);
  return { data: await buffer(out), filename: out.filename };
}

/** The data packet's version, cipher, AEAD mode and chunk size octet, and the session key packets' versions. */
async function shape(message: Buffer) {
  const at = packetBody(message, 18);
  const parsed = await openpgp.readMessage({ binaryMessage: message });
  const pkesks = parsed.packets.filterByTag(openpgp.enums.packet.publicKeyEncryptedSessionKey) as unknown as { version: number }[];
  return { seipd: [...message.subarray(at, at + 4)], pkesk: pkesks.map((p) => p.version) };
}

/** Text, since Bouncy Castle's wrapper answers the plaintext as a string. */
const text = (n: number) => Buffer.from(randomBytes(n).toString('base64').slice(0, n));

describe.each(['ocb', 'gcm'] as const)('SEIPDv2 to a v6 key preferring %s', (aead) => {
  it('is what we write: PKESK v6, SEIPD v2 with AES-256 and that mode, 256 KiB chunks', async () => {
    expect(await messageFormat(keys[aead].toPublic())).toEqual({ seipd: 2, aead });
    expect(await shape(await ourEncrypt(randomBytes(100), keys[aead].toPublic()))).toEqual({
      seipd: [2, openpgp.enums.symmetric.aes256, openpgp.enums.aead[aead], 12],
      pkesk: [6],
    });
  });

  it.each([0, 1, 100, MiB - 20, MiB, MiB + 1, 2 * MiB + 7])('round-trips %i bytes with OpenPGP.js, both ways', async (size) => {
    const key = keys[aead];
    const data = randomBytes(size);
    const ours = await ourEncrypt(data, key.toPublic());
    const theirs = await openpgp.decrypt({ message: await openpgp.readMessage({ binaryMessage: ours }), decryptionKeys: key, format: 'binary' });
    expect(Buffer.from(theirs.data as Uint8Array).equals(data)).toBe(true);
    expect(theirs.filename).toBe('v6.bin');
    expect((await ourDecrypt(ours, key)).data.equals(data)).toBe(true);
    const byOpenpgp = await openpgp.encrypt({
      message: await openpgp.createMessage({ binary: data, filename: 'g.bin' }),
      encryptionKeys: key.toPublic(),
      format: 'binary',
    });
    expect((await shape(Buffer.from(byOpenpgp))).pkesk).toEqual([6]);
    const back = await ourDecrypt(byOpenpgp, key);
    expect(back.data.equals(data)).toBe(true);
    expect(back.filename).toBe('g.bin');
  });

  it('armored and compressed, read by OpenPGP.js and by us', async () => {
    const key = keys[aead];
    const data = randomBytes(300_000);
    for (const opts of [{ armor: true }, { compress: true }, { armor: true, compress: true }]) {
      const ours = await ourEncrypt(data, key.toPublic(), opts);
      const message: openpgp.Message<Uint8Array | string> = opts.armor
        ? await openpgp.readMessage({ armoredMessage: ours.toString() })
        : await openpgp.readMessage({ binaryMessage: ours });
      expect(message.packets.filterByTag(openpgp.enums.packet.symEncryptedIntegrityProtectedData)).toHaveLength(1);
      const theirs = await openpgp.decrypt({ message, decryptionKeys: key, format: 'binary' });
      expect(Buffer.from(theirs.data as Uint8Array).equals(data), JSON.stringify(opts)).toBe(true);
      expect((await ourDecrypt(ours, key)).data.equals(data)).toBe(true);
    }
  });

  it("round-trips with Proton's OpenPGP.js, both ways", async () => {
    const key = await proton.readPrivateKey({ armoredKey: keys[aead].armor() });
    const data = randomBytes(200_000);
    const ours = await ourEncrypt(data, keys[aead].toPublic(), { armor: true });
    const theirs = await proton.decrypt({ message: await proton.readMessage({ armoredMessage: ours.toString() }), decryptionKeys: key, format: 'binary' });
    expect(Buffer.from(theirs.data as Uint8Array).equals(data)).toBe(true);
    const byProton = await proton.encrypt({ message: await proton.createMessage({ binary: data }), encryptionKeys: key.toPublic(), format: 'binary' });
    expect((await shape(Buffer.from(byProton))).pkesk).toEqual([6]);
    expect((await ourDecrypt(byProton, keys[aead])).data.equals(data)).toBe(true);
  });

  it('is read by Bouncy Castle, armored, at sizes around a chunk', { timeout: 60_000 }, async () => {
    for (const size of [1, 5000, MiB + 3]) {
      const data = text(size);
      const ours = await ourEncrypt(data, keys[aead].toPublic(), { armor: true });
      expect(await bouncyCastleDecrypt(keys[aead].armor(), ours.toString(), { runtime: 'wasm-java' }), `${size} bytes`).toBe(data.toString());
    }
  });
});

describe('the format follows the recipient key', () => {
  it('SEIPDv1 with a v3 packet to our v4 keys; SEIPDv2 to a v4 key that lists SEIPDv2', async () => {
    const ours = await generateKey({ name: 'O', email: 'o@example.test', algorithm: 'curve25519', secret: 'seipd-v2-test-secret-0' });
    const v4 = await readStoredPublicKey(ours.publicArmored);
    expect(await messageFormat(v4)).toEqual({ seipd: 1 });
    expect(await shape(await ourEncrypt(randomBytes(10), v4))).toMatchObject({
      seipd: [1, expect.any(Number), expect.any(Number), expect.any(Number)],
      pkesk: [3],
    });
    const { privateKey } = await openpgp.generateKey({
      type: 'ecc',
      curve: 'curve25519Legacy',
      userIDs: [user],
      format: 'object',
      config: { aeadProtect: true },
    });
    expect(await messageFormat(privateKey.toPublic())).toEqual({ seipd: 2, aead: 'gcm' });
    const data = randomBytes(5000);
    const message = await ourEncrypt(data, privateKey.toPublic()); // PKESK v6 to an ECDH subkey: OpenPGP.js makes it
    expect((await shape(message)).pkesk).toEqual([6]);
    expect((await ourDecrypt(message, privateKey)).data.equals(data)).toBe(true);
  });

  it('passes over suites it does not write (EAX) to the first OCB or GCM one', async () => {
    const { privateKey } = await openpgp.generateKey({
      type: 'curve25519',
      userIDs: [user],
      format: 'object',
      config: { v6Keys: true, aeadProtect: true, preferredAEADAlgorithm: openpgp.enums.aead.eax },
    });
    const self = (await (privateKey as unknown as { getPrimarySelfSignature(): Promise<{ preferredCipherSuites: number[][] }> }).getPrimarySelfSignature())
      .preferredCipherSuites;
    expect(self[0][1]).toBe(openpgp.enums.aead.eax); // EAX first: our reading passes over it
    expect(await messageFormat(privateKey.toPublic())).toEqual({ seipd: 2, aead: 'gcm' });
  });
});

describe('the session key packet step is pluggable', () => {
  it("writes SEIPDv2 under a packet another module makes: Proton's, to a post-quantum key (ML-KEM-768+X25519), which Proton opens", async () => {
    const { privateKey } = await proton.generateKey({ type: 'pqc', userIDs: [user], format: 'object', config: { v6Keys: true } });
    expect(privateKey.subkeys.map((s) => s.keyPacket.algorithm)).toEqual([35]);
    const data = randomBytes(100_000);
    const out = await encryptWith(
      source(data),
      (sessionKey, format) =>
        proton.encryptSessionKey({
          data: new Uint8Array(sessionKey),
          algorithm: 'aes256',
          aeadAlgorithm: format.seipd === 2 ? format.aead : undefined,
          encryptionKeys: privateKey.toPublic(),
          format: 'binary',
        }),
      { seipd: 2, aead: 'ocb' },
      { armor: false, compress: false },
    );
    const message = await proton.readMessage({ binaryMessage: await buffer(out) });
    const theirs = await proton.decrypt({ message, decryptionKeys: privateKey, format: 'binary' });
    expect(Buffer.from(theirs.data as Uint8Array).equals(data)).toBe(true);
  });

  it('answers no_encryption_key when the step fails', async () => {
    const failing = () => Promise.reject(new Error('no such key'));
    await expect(encryptWith(source(randomBytes(10)), failing, { seipd: 2, aead: 'gcm' }, { armor: false, compress: false })).rejects.toMatchObject({
      code: 'no_encryption_key',
    });
  });
});
