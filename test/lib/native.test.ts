import { describe, expect, it, beforeAll } from 'vitest';
import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import * as openpgp from 'openpgp';
import { generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { encryptStream, openEncrypted } from '../../lib/pgp/stream';
import { AppError } from '../../lib/errors';

/**
 * The native SEIPDv1 path (Node's AES-CFB and SHA-1) checked against OpenPGP.js as an independent
 * reader and writer, at the sizes where framing changes, and against tampering anywhere.
 */
const MiB = 1 << 20;
const SECRET = 'native-test-secret-0000';
let pub: openpgp.PublicKey;
let priv: openpgp.PrivateKey;

beforeAll(async () => {
  const key = await generateKey({ name: 'N', email: 'n@example.test', algorithm: 'curve25519', secret: SECRET });
  pub = await readStoredPublicKey(key.publicArmored);
  priv = await unlockPrivateKey(key.privateArmored, SECRET);
});

const source = (data: Buffer, chunk = 64 * 1024) =>
  Readable.from(
    (function* () {
      for (let i = 0; i < data.length; i += chunk) yield data.subarray(i, i + chunk);
    })(),
  );

async function nativeEncrypt(data: Buffer, filename = 'f.bin') {
  return buffer(await encryptStream(source(data), pub, { armor: false, filename }));
}

async function ourDecrypt(message: Buffer | Uint8Array) {
  const opened = await openEncrypted(source(Buffer.from(message), 100_000), { maxDecompressedBytes: 64 * MiB });
  const out = await opened.decrypt(priv);
  return { data: await buffer(out), filename: out.filename };
}

describe('native SEIPDv1', () => {
  it.each([0, 1, 21, 22, 23, MiB - 1, MiB, MiB + 1, 3 * MiB + 5])('round-trips %i bytes with OpenPGP.js on the other side, both ways', async (size) => {
    const data = randomBytes(size);
    const ours = await nativeEncrypt(data);
    const theirs = await openpgp.decrypt({ message: await openpgp.readMessage({ binaryMessage: ours }), decryptionKeys: priv, format: 'binary' });
    expect(Buffer.compare(Buffer.from(theirs.data as Uint8Array), data)).toBe(0);
    expect(theirs.filename).toBe('f.bin');
    const byOpenpgp = await openpgp.encrypt({
      message: await openpgp.createMessage({ binary: data, filename: 'g.bin' }),
      encryptionKeys: pub,
      format: 'binary',
    });
    const back = await ourDecrypt(byOpenpgp);
    expect(Buffer.compare(back.data, data)).toBe(0);
    expect(back.filename).toBe('g.bin');
    expect(Buffer.compare((await ourDecrypt(ours)).data, data)).toBe(0);
  });

  it('fails on a flipped bit anywhere in the encrypted data, never returning the whole plaintext', async () => {
    const data = randomBytes(2 * MiB + 100);
    const message = await nativeEncrypt(data);
    const seipdStart = message.length - data.length; // near the start of the encrypted packet (prefix, literal header)
    for (const at of [message.length - 1, message.length - 21, message.length - 30, seipdStart, seipdStart + MiB, message.length - MiB]) {
      const bad = Buffer.from(message);
      bad[at] ^= 0x40;
      const got = await ourDecrypt(bad).then(
        (r) => r.data,
        (e: unknown) => e,
      );
      expect(got, `flip at ${at}`).toBeInstanceOf(AppError);
      expect(['integrity_check_failed', 'malformed_message']).toContain((got as AppError).code);
    }
  });

  it('fails on truncated messages and trailing garbage', async () => {
    const message = await nativeEncrypt(randomBytes(300_000));
    for (const bad of [
      message.subarray(0, message.length - 1),
      message.subarray(0, message.length - 25),
      message.subarray(0, 200),
      Buffer.concat([message, Buffer.from([0xcb, 0x01, 0x00])]),
    ]) {
      await expect(ourDecrypt(bad)).rejects.toBeInstanceOf(AppError);
    }
  });

  it('leaves armored and compressed messages to OpenPGP.js, with the same results', async () => {
    const data = randomBytes(200_000);
    const armored = await openpgp.encrypt({ message: await openpgp.createMessage({ binary: data }), encryptionKeys: pub });
    expect(Buffer.compare((await ourDecrypt(Buffer.from(armored))).data, data)).toBe(0);
    const compressed = await openpgp.encrypt({
      message: await openpgp.createMessage({ binary: data }),
      encryptionKeys: pub,
      format: 'binary',
      config: { preferredCompressionAlgorithm: openpgp.enums.compression.zlib },
    });
    expect(Buffer.compare((await ourDecrypt(compressed)).data, data)).toBe(0);
  });

  it('names the recipient key ids and refuses another key', async () => {
    const other = await generateKey({ name: 'O', email: 'o@example.test', algorithm: 'curve25519', secret: SECRET });
    const message = await nativeEncrypt(randomBytes(1000));
    const opened = await openEncrypted(source(message), { maxDecompressedBytes: MiB });
    expect(opened.encryptionKeyIds).toEqual(pub.subkeys.map((s) => s.getKeyID().toHex()));
    await expect(opened.decrypt(await unlockPrivateKey(other.privateArmored, SECRET))).rejects.toMatchObject({ code: 'no_matching_key' });
  });
});
