import { describe, expect, it, beforeAll } from 'vitest';
import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import * as openpgp from 'openpgp';
import { generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { encryptStream, openEncrypted } from '../../lib/pgp/stream';
import { AppError } from '../../lib/errors';

/**
 * Decryption on Node's crypto (SEIPDv1: AES-CFB and SHA-1; SEIPDv2: AES-OCB and AES-GCM chunks) checked
 * against OpenPGP.js as an independent reader and writer, at the sizes where framing changes, and against
 * tampering anywhere; and the formats it refuses before decrypting.
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

  it('reads armored and compressed messages OpenPGP.js wrote, with the same results', async () => {
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

/** A message OpenPGP.js writes as SEIPDv2 with `aead` (a session key naming the mode forces the format), in chunks of 2^(c+6). */
async function seipdV2(data: Buffer, aead: 'ocb' | 'gcm' | 'eax', chunkSizeByte = 0, filename = 'v2.bin'): Promise<Buffer> {
  const sessionKey = { data: randomBytes(32), algorithm: 'aes256' as const, aeadAlgorithm: aead };
  const message = await openpgp.createMessage({ binary: data, filename });
  return Buffer.from(await openpgp.encrypt({ message, encryptionKeys: pub, sessionKey, format: 'binary', config: { aeadChunkSizeByte: chunkSizeByte } }));
}

const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (err: unknown) => (err instanceof AppError ? err.code : String(err)),
  );

describe('native SEIPDv2', () => {
  it.each(['ocb', 'gcm'] as const)('reads %s messages at the sizes where chunks begin and end (64-octet chunks)', async (aead) => {
    for (const size of [0, 1, 63, 64, 65, 127, 128, 129, 1000]) {
      const data = randomBytes(size);
      const { data: out, filename } = await ourDecrypt(await seipdV2(data, aead));
      expect(out.equals(data), `${aead}, ${size} bytes`).toBe(true);
      expect(filename).toBe('v2.bin');
    }
    const big = randomBytes(3 * MiB + 7); // OpenPGP.js's default chunks (256 KiB), several reads per chunk
    expect((await ourDecrypt(await seipdV2(big, aead, 12))).data.equals(big)).toBe(true);
  });

  it('fails a changed chunk, a dropped chunk, swapped chunks and a cut final tag alike (integrity_check_failed)', async () => {
    const message = await seipdV2(randomBytes(200), 'ocb'); // chunks of 64 octets: three full ones and a last of 8
    const [before, body] = seipdPacket(message);
    const head = body.subarray(0, 4 + 32); // version, cipher, mode, chunk size, salt
    const finalTag = body.subarray(body.length - 16);
    const chunks = [0, 1, 2, 3].map((i) => body.subarray(head.length + i * 80, Math.min(head.length + (i + 1) * 80, body.length - 16)));
    const rebuilt = (parts: Buffer[]) => withSeipd(before, Buffer.concat([head, ...parts]));
    expect(await code(ourDecrypt(rebuilt([...chunks, finalTag])))).toBe('ok');
    const flipped = Buffer.from(chunks[1]);
    flipped[5] ^= 1;
    for (const bad of [
      rebuilt([chunks[0], flipped, chunks[2], chunks[3], finalTag]),
      rebuilt([chunks[0], chunks[2], chunks[3], finalTag]),
      rebuilt([chunks[1], chunks[0], chunks[2], chunks[3], finalTag]),
      rebuilt([...chunks, finalTag.subarray(0, 15)]),
      rebuilt([...chunks]),
      rebuilt([chunks[0], chunks[1], chunks[2], finalTag]),
    ]) {
      expect(await code(ourDecrypt(bad))).toBe('integrity_check_failed');
    }
  });

  it.each(['ocb', 'gcm'] as const)('reads %s messages fed in pieces of any size, across chunk and tag boundaries', async (aead) => {
    const data = randomBytes(1000);
    const message = await seipdV2(data, aead);
    for (const piece of [1, 7, 16, 31, 32, 33, 80, 81]) {
      const opened = await openEncrypted(source(message, piece), { maxDecompressedBytes: MiB });
      expect((await buffer(await opened.decrypt(priv))).equals(data), `pieces of ${piece}`).toBe(true);
    }
  });

  it('refuses EAX, legacy ciphers and unprotected data before decrypting (unsupported_message)', async () => {
    expect(await code(ourDecrypt(await seipdV2(randomBytes(100), 'eax')))).toBe('unsupported_message');
    // SEIPDv1 under CAST5 (the session key packet names it; the data is never decrypted).
    const cast5 = await openpgp.encryptSessionKey({ data: randomBytes(16), algorithm: 'cast5', encryptionKeys: pub, format: 'binary' });
    const v1 = Buffer.concat([Buffer.from(cast5), Buffer.from([0xd2, 40, 1]), randomBytes(39)]);
    expect(await code(ourDecrypt(v1))).toBe('unsupported_message');
    // Symmetrically Encrypted Data (tag 9): no integrity protection.
    const aes = await openpgp.encryptSessionKey({ data: randomBytes(32), algorithm: 'aes256', encryptionKeys: pub, format: 'binary' });
    expect(await code(ourDecrypt(Buffer.concat([Buffer.from(aes), Buffer.from([0xc9, 40]), randomBytes(40)])))).toBe('unsupported_message');
  });
});

/** What precedes a message's SEIPD packet, and that packet's body (new-format definite lengths, as OpenPGP.js writes in memory). */
function seipdPacket(message: Buffer): [Buffer, Buffer] {
  for (let at = 0; at < message.length;) {
    const o = message[at + 1];
    const [bodyAt, length] = o < 192 ? [at + 2, o] : o < 224 ? [at + 3, ((o - 192) << 8) + message[at + 2] + 192] : [at + 6, message.readUInt32BE(at + 2)];
    if ((message[at] & 0x3f) === 18) return [message.subarray(0, at), message.subarray(bodyAt, bodyAt + length)];
    at = bodyAt + length;
  }
  throw new Error('no SEIPD packet');
}

/** `before`, then a SEIPD packet of `body` with a five-octet length. */
function withSeipd(before: Buffer, body: Buffer): Buffer {
  const length = Buffer.alloc(4);
  length.writeUInt32BE(body.length);
  return Buffer.concat([before, Buffer.from([0xd2, 0xff]), length, body]);
}
