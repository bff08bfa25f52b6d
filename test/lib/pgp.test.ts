import { randomBytes } from 'node:crypto';
import { PassThrough, Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import * as openpgp from 'openpgp';
import { beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../lib/errors';
import { generateKey, MAX_PUBLIC_KEY_BYTES, readStoredPublicKey, unlockPrivateKey, type GeneratedKey } from '../../lib/pgp/keys';
import { readRecipientKey } from '../../lib/pgp/import';
import { encryptStream, openEncrypted } from '../../lib/pgp/stream';

const MiB = 1 << 20;
const SECRET = 'generation-secret';

function source(data: Uint8Array, chunk = 256 * 1024): Readable {
  return Readable.from(
    (function* () {
      for (let i = 0; i < data.length; i += chunk) yield Buffer.from(data.subarray(i, i + chunk));
    })(),
  );
}

async function collect(stream: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const chunk of stream) parts.push(chunk as Buffer);
  return Buffer.concat(parts);
}

async function encrypt(data: Uint8Array, key: openpgp.PublicKey, opts: Parameters<typeof encryptStream>[2]): Promise<Buffer> {
  return collect(await encryptStream(source(data), key, opts));
}

async function decrypt(message: Uint8Array, key: openpgp.PrivateKey, maxDecompressedBytes = 1 << 30) {
  const opened = await openEncrypted(source(message), { maxDecompressedBytes });
  const out = await opened.decrypt(key);
  return { ids: opened.encryptionKeyIds, filename: out.filename, data: await collect(out) };
}

/** Decrypts into a sink the way a worker writes a blob: returns what arrived and the error, if any. */
async function decryptToSink(message: Uint8Array, key: openpgp.PrivateKey): Promise<{ received: number; error: unknown }> {
  let received = 0;
  try {
    const opened = await openEncrypted(source(message), { maxDecompressedBytes: 1 << 30 });
    const sink = new Writable({
      write(chunk: Buffer, _enc, cb) {
        received += chunk.length;
        cb();
      },
    });
    await pipeline(await opened.decrypt(key), sink);
    return { received, error: undefined };
  } catch (error) {
    return { received, error };
  }
}

async function expectAppError(p: Promise<unknown>, code: string, status = 422): Promise<void> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err, `expected ${code}`).toBeInstanceOf(AppError);
  expect((err as AppError).code).toBe(code);
  expect((err as AppError).status).toBe(status);
}

function primarySig(key: openpgp.Key) {
  return key.users[0].selfCertifications[0];
}

describe('generateKey', () => {
  it.each(['curve25519', 'rsa3072'] as const)('generates a gpg-compatible v4 %s key', async (algorithm) => {
    const created = new Date('2025-01-02T03:04:05.678Z');
    const k = await generateKey({ name: 'Alice', email: 'alice@example.com', algorithm, secret: SECRET, expiresInDays: 30, date: created });
    expect(k.fingerprint).toMatch(/^[0-9a-f]{40}$/);
    expect(k.keyId).toBe(k.fingerprint.slice(-16));
    expect(k.encryptionKeyIds).toHaveLength(1);
    expect(k.encryptionKeyIds[0]).toMatch(/^[0-9a-f]{16}$/);
    expect(k.algorithm).toBe(algorithm);
    expect(k.createdAt.toISOString()).toBe('2025-01-02T03:04:05.000Z');
    expect(k.expiresAt?.getTime()).toBe(k.createdAt.getTime() + 30 * 86_400_000);
    expect(k.publicArmored).toContain('BEGIN PGP PUBLIC KEY BLOCK');

    const pub = await readStoredPublicKey(k.publicArmored);
    expect(pub.keyPacket.version).toBe(4);
    expect(pub.getAlgorithmInfo()).toEqual(
      algorithm === 'curve25519' ? { algorithm: 'eddsaLegacy', curve: 'ed25519Legacy' } : { algorithm: 'rsaEncryptSign', bits: 3072 },
    );
    expect(pub.subkeys[0].getAlgorithmInfo().algorithm).toBe(algorithm === 'curve25519' ? 'ecdh' : 'rsaEncryptSign');
    expect((await pub.getExpirationTime())?.valueOf()).toBe(k.expiresAt?.getTime());
    // Preferences that keep encryption to this key SEIPDv1 + AES-256 and uncompressed.
    const sig = primarySig(pub);
    expect(sig.features?.[0]).toBe(0x01); // modification detection only, no SEIPDv2 (0x08)
    expect(sig.preferredSymmetricAlgorithms?.[0]).toBe(openpgp.enums.symmetric.aes256);
    expect(sig.preferredHashAlgorithms?.slice(0, 2)).toEqual([openpgp.enums.hash.sha512, openpgp.enums.hash.sha256]);
    expect(sig.preferredCompressionAlgorithms?.[0]).toBe(openpgp.enums.compression.uncompressed);
    expect((sig as unknown as { preferredCipherSuites: unknown }).preferredCipherSuites).toBeNull();

    // The private key is locked with the secret.
    const locked = await openpgp.readPrivateKey({ armoredKey: k.privateArmored });
    expect(locked.isDecrypted()).toBe(false);
    expect((await unlockPrivateKey(k.privateArmored, SECRET)).isDecrypted()).toBe(true);
    await expectAppError(unlockPrivateKey(k.privateArmored, 'wrong'), 'wrong_passphrase');
  });

  it('generates rsa4096', { timeout: 60_000 }, async () => {
    const k = await generateKey({ name: 'Big', email: 'big@example.com', algorithm: 'rsa4096', secret: SECRET });
    expect(k.expiresAt).toBeNull();
    expect((await readStoredPublicKey(k.publicArmored)).getAlgorithmInfo()).toEqual({ algorithm: 'rsaEncryptSign', bits: 4096 });
  });

  it('rejects unknown algorithms and bad expiry', async () => {
    // @ts-expect-error: not a KeyAlgorithm
    await expectAppError(generateKey({ name: 'x', email: 'x@example.com', algorithm: 'dsa', secret: SECRET }), 'invalid_algorithm');
    await expectAppError(generateKey({ name: 'x', email: 'x@example.com', algorithm: 'curve25519', secret: SECRET, expiresInDays: 0 }), 'invalid_expiry');
    await expectAppError(generateKey({ name: 'x', email: 'x@example.com', algorithm: 'curve25519', secret: SECRET, expiresInDays: 49_711 }), 'invalid_expiry');
    expect((await generateKey({ name: 'x', email: 'x@example.com', algorithm: 'curve25519', secret: SECRET, expiresInDays: 49_710 })).expiresAt).not.toBeNull();
  });
});

describe('encryptStream / openEncrypted', () => {
  let alice: GeneratedKey;
  let alicePub: openpgp.PublicKey;
  let alicePriv: openpgp.PrivateKey;
  let bobPriv: openpgp.PrivateKey;
  const data = randomBytes(3 * MiB + 123);

  beforeAll(async () => {
    alice = await generateKey({ name: 'Alice', email: 'alice@example.com', algorithm: 'curve25519', secret: SECRET });
    alicePub = await readStoredPublicKey(alice.publicArmored);
    alicePriv = await unlockPrivateKey(alice.privateArmored, SECRET);
    const bob = await generateKey({ name: 'Bob', email: 'bob@example.com', algorithm: 'curve25519', secret: SECRET });
    bobPriv = await unlockPrivateKey(bob.privateArmored, SECRET);
  });

  it.each([false, true])('round-trips (armor: %s) keeping the file name, SEIPDv1 without compression', async (armor) => {
    const message = await encrypt(data, alicePub, { armor, filename: 'report ünïcode.pdf' });
    expect(message.subarray(0, 27).toString('latin1') === '-----BEGIN PGP MESSAGE-----').toBe(armor);
    const parsed = armor
      ? await openpgp.readMessage({ armoredMessage: message.toString('latin1') })
      : await openpgp.readMessage({ binaryMessage: new Uint8Array(message) });
    expect(parsed.packets.map((p) => (p.constructor as { tag?: number }).tag)).toEqual([
      openpgp.enums.packet.publicKeyEncryptedSessionKey,
      openpgp.enums.packet.symEncryptedIntegrityProtectedData,
    ]);
    expect((parsed.packets[1] as unknown as { version: number }).version).toBe(1);
    if (!armor) expect(message.length).toBeLessThan(data.length + 4096); // not base64, not padded

    const out = await decrypt(message, alicePriv);
    expect(out.ids).toEqual(alice.encryptionKeyIds);
    expect(out.filename).toBe('report ünïcode.pdf');
    expect(out.data.equals(data)).toBe(true);
  });

  it('compresses with zlib only when asked', async () => {
    const text = Buffer.from('the same line over and over again\n'.repeat(100_000));
    const plain = await encrypt(text, alicePub, { armor: false });
    const zipped = await encrypt(text, alicePub, { armor: false, compress: true, filename: 'a.txt' });
    expect(plain.length).toBeGreaterThan(text.length);
    expect(zipped.length).toBeLessThan(text.length / 50);
    const out = await decrypt(zipped, alicePriv);
    expect(out.data.equals(text)).toBe(true);
    expect(out.filename).toBe('a.txt');
    // The inner packet really is a zlib Compressed Data packet, as gpg and sq expect.
    const inner = await (await openpgp.readMessage({ binaryMessage: new Uint8Array(zipped) })).decrypt([alicePriv]);
    expect((inner.packets[0].constructor as { tag?: number }).tag).toBe(openpgp.enums.packet.compressedData);
    expect((inner.packets[0] as unknown as { algorithm: number }).algorithm).toBe(openpgp.enums.compression.zlib);
    const armored = await encrypt(data, alicePub, { armor: true, compress: true });
    expect((await decrypt(armored, alicePriv)).data.equals(data)).toBe(true);
    // Signed, OpenPGP.js writes the message (compressed through its public option); read and verified alike.
    const signed = await encrypt(text, alicePub, { armor: false, compress: true, signingKey: alicePriv });
    expect(signed.length).toBeLessThan(text.length / 50);
    const opened = await openEncrypted(source(signed), {
      maxDecompressedBytes: 1 << 30,
      verify: { keys: [{ key: alicePub, fingerprint: 'alice' }], require: true },
    });
    const out2 = await opened.decrypt(alicePriv);
    expect((await collect(out2)).equals(text)).toBe(true);
    expect(await out2.signature).toMatchObject({ valid: true, signer_fingerprint: 'alice' });
  });

  it('handles empty input', async () => {
    const out = await decrypt(await encrypt(new Uint8Array(0), alicePub, { armor: false }), alicePriv);
    expect(out.data.length).toBe(0);
  });

  it('fails the output stream on a tampered ciphertext and never delivers the complete plaintext', async () => {
    const message = await encrypt(data, alicePub, { armor: false });
    for (const at of [Math.floor(message.length / 2), message.length - 30, message.length - 1]) {
      const tampered = Buffer.from(message);
      tampered[at] ^= 0x01;
      const { received, error } = await decryptToSink(tampered, alicePriv);
      expect(error).toBeInstanceOf(AppError);
      expect((error as AppError).code).toBe('integrity_check_failed');
      expect(received).toBeLessThan(data.length);
    }
  });

  it('fails a truncated message', async () => {
    const message = await encrypt(data, alicePub, { armor: false });
    const { received, error } = await decryptToSink(message.subarray(0, message.length - 1000), alicePriv);
    expect((error as AppError).code).toMatch(/^(malformed_message|integrity_check_failed)$/);
    expect(received).toBeLessThan(data.length);
  });

  it('detects AEAD (SEIPDv2) tampering too', async () => {
    const { privateKey } = await openpgp.generateKey({
      userIDs: [{ email: 'aead@example.com' }],
      type: 'ecc',
      curve: 'curve25519Legacy',
      format: 'object',
      config: { aeadProtect: true },
    });
    const message = await encrypt(data, privateKey.toPublic(), { armor: false });
    expect((await decrypt(message, privateKey)).data.equals(data)).toBe(true);
    const tampered = Buffer.from(message);
    tampered[Math.floor(message.length / 2)] ^= 0x80;
    const { error } = await decryptToSink(tampered, privateKey);
    expect((error as AppError).code).toBe('integrity_check_failed');
  });

  it('lists recipients before decrypting and refuses a key that is not one of them', async () => {
    const message = await encrypt(data, alicePub, { armor: true });
    const opened = await openEncrypted(source(message), { maxDecompressedBytes: MiB });
    expect(opened.encryptionKeyIds).toEqual(alice.encryptionKeyIds);
    await expectAppError(opened.decrypt(bobPriv), 'no_matching_key');
  });

  it('rejects input that is not an encrypted OpenPGP message', async () => {
    const notEncrypted = await openpgp.encrypt({ message: await openpgp.createMessage({ binary: data.subarray(0, 100) }), passwords: 'pw', format: 'binary' });
    const signedOnly = await openpgp.sign({ message: await openpgp.createMessage({ text: 'hi' }), signingKeys: alicePriv, format: 'binary' });
    for (const input of [
      Buffer.alloc(0),
      Buffer.from('hello, world'),
      Buffer.from('-----BEGIN PGP MESSAGE-----\n\nnot base64 at all!!\n-----END PGP MESSAGE-----\n'),
      Buffer.from([0x85, 0x01]),
      notEncrypted,
      signedOnly,
    ]) {
      await expectAppError(openEncrypted(source(input), { maxDecompressedBytes: MiB }), 'malformed_message');
    }
  });

  it('caps decompression (bomb)', async () => {
    const zeros = new Uint8Array(64 * MiB);
    const bomb = await encrypt(zeros, alicePub, { armor: false, compress: true });
    expect(bomb.length).toBeLessThan(200 * 1024);
    const opened = await openEncrypted(source(bomb), { maxDecompressedBytes: 4 * MiB });
    const out = await opened.decrypt(alicePriv);
    let received = 0;
    const err = await pipeline(
      out,
      new Writable({
        write(c: Buffer, _e, cb) {
          received += c.length;
          cb();
        },
      }),
    ).catch((e: unknown) => e);
    // The decompressed size is a fact of unverified plaintext: answered like any damage found once decrypting.
    expect((err as AppError).code).toBe('integrity_check_failed');
    expect(received).toBeLessThanOrEqual(4 * MiB);
  });

  it('passes the input stream’s own error through unchanged', async () => {
    const failing = new PassThrough();
    const boom = new Error('disk on fire');
    const out = await encryptStream(failing, alicePub, { armor: false });
    failing.write(randomBytes(1000));
    setTimeout(() => failing.destroy(boom), 10);
    await expect(collect(out)).rejects.toBe(boom);

    const message = await encrypt(data, alicePub, { armor: false });
    const partial = new PassThrough();
    partial.write(message.subarray(0, 64 * 1024));
    const opened = await openEncrypted(partial, { maxDecompressedBytes: MiB });
    const plain = await opened.decrypt(alicePriv);
    setTimeout(() => partial.destroy(boom), 10);
    await expect(collect(plain)).rejects.toBe(boom);
  });

  it('stops reading the input when the reader of the output goes away', async () => {
    const big = randomBytes(8 * MiB);
    const message = await encrypt(big, alicePub, { armor: false });
    const encInput = source(big, 64 * 1024);
    for await (const _ of await encryptStream(encInput, alicePub, { armor: false })) break;
    const decInput = source(message, 64 * 1024);
    for await (const _ of await (await openEncrypted(decInput, { maxDecompressedBytes: MiB })).decrypt(alicePriv)) break;
    await new Promise((r) => setTimeout(r, 50));
    expect(encInput.destroyed).toBe(true);
    expect(decInput.destroyed).toBe(true);
  });

  it('still decrypts for an expired key (old generations), but will not encrypt to it', async () => {
    const past = new Date(Date.now() - 3 * 86_400_000);
    const old = await generateKey({ name: 'Old', email: 'old@example.com', algorithm: 'curve25519', secret: SECRET, expiresInDays: 1, date: past });
    const oldPub = await readStoredPublicKey(old.publicArmored);
    const message = await openpgp.encrypt({
      message: await openpgp.createMessage({ binary: data.subarray(0, 1000) }),
      encryptionKeys: oldPub,
      date: new Date(past.getTime() + 3_600_000),
      format: 'binary',
    });
    const out = await decrypt(message, await unlockPrivateKey(old.privateArmored, SECRET));
    expect(out.data.equals(data.subarray(0, 1000))).toBe(true);
    await expectAppError(encryptStream(source(data), oldPub, { armor: false }), 'no_encryption_key');
  });

  it('wants an unlocked private key', async () => {
    const message = await encrypt(data.subarray(0, 100), alicePub, { armor: false });
    const opened = await openEncrypted(source(message), { maxDecompressedBytes: MiB });
    const locked = await openpgp.readPrivateKey({ armoredKey: alice.privateArmored });
    await expect(opened.decrypt(locked)).rejects.toThrow(/unlocked/);
  });

  it('refuses file names that do not fit the literal packet', async () => {
    await expectAppError(encryptStream(source(data), alicePub, { armor: false, filename: 'é'.repeat(128) }), 'invalid_filename');
  });
});

/** Splits new-format packets with definite lengths (what OpenPGP.js writes for in-memory messages). */
function packets(bytes: Uint8Array): { tag: number; body: Uint8Array }[] {
  const out: { tag: number; body: Uint8Array }[] = [];
  for (let i = 0; i < bytes.length;) {
    const tag = bytes[i++] & 0x3f;
    const l0 = bytes[i++];
    let len: number;
    if (l0 < 192) len = l0;
    else if (l0 < 224) len = ((l0 - 192) << 8) + bytes[i++] + 192;
    else if (l0 === 255) {
      len = new DataView(bytes.buffer, bytes.byteOffset + i, 4).getUint32(0);
      i += 4;
    } else throw new Error('partial length in fixture');
    out.push({ tag, body: bytes.subarray(i, i + len) });
    i += len;
  }
  return out;
}

/** Frames a packet body as partial chunks of the given power-of-two sizes, then a definite rest. */
function partialPacket(tag: number, body: Uint8Array, sizes: number[]): Buffer {
  const parts: Buffer[] = [Buffer.of(0xc0 | tag)];
  let at = 0;
  for (let k = 0; body.length - at > 512; k++) {
    const size = Math.min(sizes[k % sizes.length], 2 ** Math.floor(Math.log2(body.length - at - 1)));
    parts.push(Buffer.of(224 + Math.log2(size)), Buffer.from(body.subarray(at, at + size)));
    at += size;
  }
  const rest = Buffer.alloc(5);
  rest[0] = 255;
  rest.writeUInt32BE(body.length - at, 1);
  parts.push(rest, Buffer.from(body.subarray(at)));
  return Buffer.concat(parts);
}

function armorWith(binary: Uint8Array, opts: { lineLength: number; eol: string; headers?: string[]; crc?: boolean; padLine?: boolean }): Buffer {
  const b64 = Buffer.from(binary).toString('base64');
  const digits = opts.padLine ? b64.replace(/=+$/, '') : b64;
  const lines: string[] = digits.match(new RegExp(`.{1,${opts.lineLength}}`, 'g')) ?? [];
  if (opts.padLine) lines.push(b64.slice(digits.length));
  const crcLine = opts.crc ? [`=${openpgp.armor(openpgp.enums.armor.message, binary, undefined, undefined, undefined, true).match(/^=(.{4})$/m)![1]}`] : [];
  const all = ['', '-----BEGIN PGP MESSAGE-----', ...(opts.headers ?? []), '', ...lines, ...crcLine, '-----END PGP MESSAGE-----', 'trailing text'];
  return Buffer.from(all.join(opts.eol));
}

describe('input framing we accept', () => {
  let key: openpgp.PrivateKey;
  let message: Uint8Array;
  const data = randomBytes(300_000);
  beforeAll(async () => {
    const gen = await generateKey({ name: 'F', email: 'f@example.com', algorithm: 'curve25519', secret: SECRET });
    key = await unlockPrivateKey(gen.privateArmored, SECRET);
    const literal = await openpgp.createMessage({ binary: new Uint8Array(data), filename: 'f.bin' });
    message = await openpgp.encrypt({ message: literal, encryptionKeys: key.toPublic(), format: 'binary' });
  });

  async function decryptChunked(input: Uint8Array, chunk: number): Promise<Buffer> {
    const opened = await openEncrypted(source(input, chunk), { maxDecompressedBytes: MiB });
    return collect(await opened.decrypt(key));
  }

  it('re-frames partial body lengths of any size, whatever the read sizes', async () => {
    const [pkesk, seipd] = packets(message);
    for (const sizes of [[512], [8192], [1 << 20], [512, 4096, 65536, 1024]]) {
      const framed = Buffer.concat([Buffer.of(0xc1, pkesk.body.length), Buffer.from(pkesk.body), partialPacket(18, seipd.body, sizes)]);
      for (const chunk of [7, 4096, MiB]) expect((await decryptChunked(framed, chunk)).equals(data), `${sizes.join(',')} / ${chunk}`).toBe(true);
    }
  });

  it('reads armor with CRLF, headers, any line length, with or without CRC, in any read size', async () => {
    const variants = [
      armorWith(message, { lineLength: 64, eol: '\n', crc: true }),
      armorWith(message, { lineLength: 76, eol: '\r\n', headers: ['Version: GnuPG v2', 'Comment: hello: world'] }),
      armorWith(message, { lineLength: 63, eol: '\n', padLine: true, crc: true }), // '==' wrapped onto a line of its own
      armorWith(message, { lineLength: 10_000_000, eol: '\n' }), // one long line
    ];
    expect(variants[2].toString()).toMatch(/\n==\n=[A-Za-z0-9+/]{4}\n-----END/);
    for (const armored of variants) {
      for (const chunk of [5, 1000, MiB]) expect((await decryptChunked(armored, chunk)).equals(data)).toBe(true);
    }
  });

  it('rejects broken armor: malformed_message before decryption, the integrity error once it has begun', async () => {
    const good = armorWith(message, { lineLength: 64, eol: '\n' }).toString();
    const broken: [string, string][] = [
      [good.replace(/\n([A-Za-z0-9+/]{10})/, '\n$1*'), 'malformed_message'], // not base64, in the head
      [good.replace(/PGP MESSAGE/g, 'PGP PUBLIC KEY BLOCK'), 'malformed_message'],
      [good.replace('-----END PGP MESSAGE-----', ''), 'integrity_check_failed'], // truncated
      [good.replace(/(\n[A-Za-z0-9+/]{64}){400}\n([A-Za-z0-9+/]{10})/, '$&*'), 'integrity_check_failed'], // not base64, further on
    ];
    for (const [text, expected] of broken) {
      expect(text).not.toBe(good);
      const err = await decryptChunked(Buffer.from(text), 4096).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect((err as AppError).code, text.slice(-80)).toBe(expected);
    }
  });
});

describe('readRecipientKey', () => {
  let good: GeneratedKey;
  beforeAll(async () => {
    good = await generateKey({ name: 'Carol', email: 'carol@example.com', algorithm: 'curve25519', secret: SECRET, expiresInDays: 10 });
  });

  it('accepts a public key and reports its encryption subkeys', async () => {
    const r = await readRecipientKey(good.publicArmored);
    expect(r.fingerprint).toBe(good.fingerprint);
    expect(r.encryptionKeyIds).toEqual(good.encryptionKeyIds);
    expect(r.expiresAt?.getTime()).toBe(good.expiresAt?.getTime());
    expect('isPrivate' in r.key && r.key.isPrivate()).toBe(false);
  });

  it('rejects garbage', async () => {
    for (const input of ['', 'hello', '-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nAAAA\n-----END PGP PUBLIC KEY BLOCK-----\n']) {
      await expectAppError(readRecipientKey(input), 'invalid_public_key');
    }
  });

  it('rejects oversized input with 413', async () => {
    await expectAppError(readRecipientKey('x'.repeat(MAX_PUBLIC_KEY_BYTES + 1)), 'public_key_too_large', 413);
  });

  it('rejects private keys, however they are wrapped', async () => {
    await expectAppError(readRecipientKey(good.privateArmored), 'private_key_supplied');
    await expectAppError(readRecipientKey(good.privateArmored.replace(/PRIVATE KEY/g, 'PUBLIC KEY')), 'private_key_supplied');
    // A public primary key carrying a secret subkey.
    const priv = await openpgp.readPrivateKey({ armoredKey: good.privateArmored });
    const packets = [...(await readStoredPublicKey(good.publicArmored)).toPacketList()];
    const at = packets.findIndex((p) => p instanceof openpgp.PublicSubkeyPacket);
    packets[at] = priv.subkeys[0].keyPacket;
    const list = new openpgp.PacketList<openpgp.AnyPacket>();
    list.push(...packets);
    await expectAppError(readRecipientKey(openpgp.armor(openpgp.enums.armor.publicKey, list.write())), 'private_key_supplied');
  });

  it('rejects sign-only, expired and revoked keys', async () => {
    const { publicKey: signOnly } = await openpgp.generateKey({
      userIDs: [{ email: 'sign@example.com' }],
      type: 'ecc',
      curve: 'curve25519Legacy',
      subkeys: [],
    });
    await expectAppError(readRecipientKey(signOnly), 'no_encryption_key');

    const expired = await generateKey({
      name: 'E',
      email: 'e@example.com',
      algorithm: 'curve25519',
      secret: SECRET,
      expiresInDays: 1,
      date: new Date(Date.now() - 2 * 86_400_000),
    });
    await expectAppError(readRecipientKey(expired.publicArmored), 'no_encryption_key');

    const { publicKey: revoked } = await openpgp.revokeKey({ key: await unlockPrivateKey(good.privateArmored, SECRET) });
    await expectAppError(readRecipientKey(revoked), 'no_encryption_key');
  });

  it('rejects a block with several keys', async () => {
    const other = await generateKey({ name: 'D', email: 'd@example.com', algorithm: 'curve25519', secret: SECRET });
    const both = openpgp.armor(
      openpgp.enums.armor.publicKey,
      new Uint8Array([...(await readStoredPublicKey(good.publicArmored)).write(), ...(await readStoredPublicKey(other.publicArmored)).write()]),
    );
    await expectAppError(readRecipientKey(both), 'invalid_public_key');
  });
});
