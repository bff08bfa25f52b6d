import { describe, expect, it, beforeAll } from 'vitest';
import { createCipheriv, createHash, randomBytes } from 'node:crypto';
import { deflateSync } from 'node:zlib';
import { PassThrough, Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import * as openpgp from 'openpgp';
import { generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { encryptStream, openEncrypted } from '../../lib/pgp/stream';
import { MAX_SESSION_KEY_TRIES } from '../../lib/pgp/session';
import { Watch } from '../../lib/pgp/watch';
import { AppError } from '../../lib/errors';
import { armorMessage, flipInnerTag, packetBody } from '../support/tamper';

/** Input that used to stall the reader or cost far more than its size. */
const MiB = 1 << 20;
const SECRET = 'hostile-test-secret-000';
let pub: openpgp.PublicKey;
let priv: openpgp.PrivateKey;

beforeAll(async () => {
  const key = await generateKey({ name: 'H', email: 'h@example.test', algorithm: 'curve25519', secret: SECRET });
  pub = await readStoredPublicKey(key.publicArmored);
  priv = await unlockPrivateKey(key.privateArmored, SECRET);
});

/** A source that counts what is pulled from it and notices being destroyed. */
function counting(data: Buffer, chunk = 64 * 1024) {
  const state = { pulled: 0, destroyed: false };
  const stream = Readable.from(
    (function* () {
      for (let i = 0; i < data.length; i += chunk) {
        state.pulled += Math.min(chunk, data.length - i);
        yield data.subarray(i, i + chunk);
      }
    })(),
  );
  stream.once('close', () => (state.destroyed = true));
  return { stream, state };
}

const code = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (err: unknown) => (err instanceof AppError ? err.code : err),
  );

async function decryptAll(message: Buffer, input = counting(message).stream, key = priv, opts: { idleMs?: number; signal?: AbortSignal } = {}) {
  const opened = await openEncrypted(input, { maxDecompressedBytes: MiB, ...opts });
  return buffer(await opened.decrypt(key));
}

/** What OpenPGP.js writes to the key and a password: a password packet before ours, its own framing. */
async function fromOpenPGPjs(data: Buffer, key = pub): Promise<Buffer> {
  const message = await openpgp.createMessage({ binary: data });
  return Buffer.from(await openpgp.encrypt({ message, encryptionKeys: key, passwords: ['pw'], format: 'binary' }));
}

/**
 * A SEIPDv1 message to `key` whose decrypted contents are `inner` (any packets we like); with `passwords`,
 * a password packet beside ours.
 */
async function sealed(inner: Buffer, key = pub, passwords?: string[]): Promise<Buffer> {
  const sessionKey = randomBytes(32);
  const pkesk = await openpgp.encryptSessionKey({ data: sessionKey, algorithm: 'aes256', encryptionKeys: key, passwords, format: 'binary' });
  const prefix = randomBytes(16);
  const plain = Buffer.concat([prefix, prefix.subarray(14), inner, Buffer.from([0xd3, 0x14])]);
  const mdc = createHash('sha1').update(plain).digest();
  const cipher = createCipheriv('aes-256-cfb', sessionKey, Buffer.alloc(16));
  const body = Buffer.concat([Buffer.from([1]), cipher.update(Buffer.concat([plain, mdc])), cipher.final()]);
  const length = Buffer.alloc(5);
  length[0] = 0xff;
  length.writeUInt32BE(body.length, 1);
  return Buffer.concat([Buffer.from(pkesk), Buffer.from([0xd2]), length, body]);
}

/** A packet with its body in 1-octet partial chunks (0xe0), the last octet with a definite length. */
function tinyChunks(ctb: number, content: Buffer): Buffer {
  const parts = [Buffer.from([ctb])];
  for (let i = 0; i < content.length - 1; i++) parts.push(Buffer.from([0xe0, content[i]]));
  parts.push(Buffer.from([1, content[content.length - 1]]));
  return Buffer.concat(parts);
}

/** A password session key packet (of another message: only its presence matters; it is passed over). */
async function passwordPacket(): Promise<Buffer> {
  const packet = await openpgp.encryptSessionKey({ data: randomBytes(32), algorithm: 'aes256', passwords: ['pw'], format: 'binary' });
  return Buffer.from(packet);
}

const literal = (data: Buffer) => Buffer.concat([Buffer.from([0x62, 0, 0, 0, 0, 0]), data]);

describe('hostile OpenPGP input', () => {
  it('a one-byte change that makes the inner packet an encrypted-data packet is refused at once (as damaged), binary and armored', async () => {
    const honest = await buffer(await encryptStream(Readable.from([randomBytes(4096)]), pub, { armor: false }));
    for (const tampered of [flipInnerTag(honest), armorMessage(flipInnerTag(honest))]) {
      const { stream, state } = counting(tampered);
      const started = Date.now();
      expect(await code(decryptAll(tampered, stream))).toBe('integrity_check_failed');
      expect(Date.now() - started).toBeLessThan(5000);
      await new Promise((r) => setImmediate(r)); // destroy() passes on, and emits close, a tick later
      expect(state.destroyed).toBe(true);
    }
  });

  it('a marker packet longer than "PGP" is refused without reading its declared length', async () => {
    const length = 64 * MiB;
    const head = Buffer.from([0xca, 0xff, (length >>> 24) & 0xff, (length >>> 16) & 0xff, (length >>> 8) & 0xff, length & 0xff]);
    const message = Buffer.concat([head, Buffer.alloc(length, 0x50)]);
    const { stream, state } = counting(message);
    expect(await code(decryptAll(message, stream))).toBe('malformed_message');
    expect(state.pulled).toBeLessThan(4 * MiB); // read-ahead only, not the 64 MiB it declares
  });

  it('refuses partial body lengths below 512 octets', async () => {
    const honest = await buffer(await encryptStream(Readable.from([randomBytes(2000)]), pub, { armor: false }));
    // Re-frame the SEIPD body as 1-octet partial chunks (0xe0) ending with a definite one.
    let at = 0;
    while ((honest[at] & 0x3f) !== 18) at += 2 + honest[at + 1]; // PKESKs have one-octet lengths here
    const ctb = honest[at];
    const lenOctet = honest[at + 1];
    const bodyAt = lenOctet < 192 ? at + 2 : lenOctet < 224 ? at + 3 : lenOctet === 255 ? at + 6 : at + 2;
    const bodyEnd = lenOctet >= 224 && lenOctet < 255 ? honest.length : honest.length;
    const bodyBytes = honest.subarray(bodyAt, bodyEnd);
    const parts: Buffer[] = [honest.subarray(0, at), Buffer.from([ctb])];
    for (let i = 0; i < bodyBytes.length - 1; i++) parts.push(Buffer.from([0xe0, bodyBytes[i]]));
    parts.push(Buffer.from([1, bodyBytes[bodyBytes.length - 1]]));
    expect(await code(decryptAll(Buffer.concat(parts)))).toBe('malformed_message');
  });

  it('passes a storage error of the input on unchanged (retried), never as a malformed message', async () => {
    const honest = await buffer(await encryptStream(Readable.from([randomBytes(100)]), pub, { armor: false }));
    const storage = Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' });
    for (const cut of [0, 5, 40]) {
      const failing = Readable.from(
        (async function* () {
          if (cut) yield honest.subarray(0, cut);
          throw storage;
        })(),
      );
      const err = await decryptAll(honest, failing).catch((e: unknown) => e);
      expect(err, `error after ${cut} bytes`).toBe(storage);
    }
  });

  it('the byte flip in a message OpenPGP.js wrote (binary and armored) is refused at once, not after the idle timeout, and the input is destroyed', async () => {
    const honest = await fromOpenPGPjs(randomBytes(4096));
    for (const tampered of [flipInnerTag(honest), armorMessage(flipInnerTag(honest))]) {
      const { stream, state } = counting(tampered);
      const started = Date.now();
      expect(await code(decryptAll(tampered, stream, priv, { idleMs: 60_000 }))).toBe('integrity_check_failed');
      expect(Date.now() - started).toBeLessThan(5000);
      await new Promise((r) => setImmediate(r)); // as above
      expect(state.destroyed).toBe(true);
    }
    // An honest one reads.
    const data = randomBytes(5000);
    expect((await decryptAll(await fromOpenPGPjs(data), undefined, priv, { idleMs: 300 })).equals(data)).toBe(true);
  });

  it('a call into OpenPGP.js that never settles fails after idleMs (422) and destroys the input; waits on our input do not count', async () => {
    const input = new PassThrough();
    const watch = new Watch(input, { idleMs: 200 });
    const slowInput = new Promise((resolve) => setTimeout(resolve, 500));
    const started = Date.now();
    const hung = watch.call(new Promise(() => {}));
    await watch.pulling(slowInput); // OpenPGP.js waiting on our (slow) input: not idle
    expect(watch.failure).toBeUndefined();
    expect(await code(hung)).toBe('malformed_message');
    expect(Date.now() - started).toBeGreaterThanOrEqual(650);
    expect(input.destroyed).toBe(true);
    watch.close();
  });

  it('an abort stops a pending read with the signal’s reason and destroys the input', async () => {
    const message = await fromOpenPGPjs(randomBytes(3 * MiB));
    const input = new PassThrough();
    input.write(message.subarray(0, 2 * MiB)); // the rest never comes: the reader waits
    const controller = new AbortController();
    const reason = new Error('job stopped');
    const opened = await openEncrypted(input, { maxDecompressedBytes: 4 * MiB, signal: controller.signal, idleMs: 60_000 });
    const pending = opened.decrypt(priv).then((out) => buffer(out));
    setTimeout(() => controller.abort(reason), 200);
    await expect(pending).rejects.toBe(reason);
    expect(input.destroyed).toBe(true);
  });

  it('encryptStream: an abort fails the output with its reason and destroys the input (Node crypto and OpenPGP.js, which signs)', async () => {
    for (const signingKey of [undefined, priv]) {
      const input = new PassThrough();
      input.write(randomBytes(1000));
      const controller = new AbortController();
      const reason = new Error('job stopped');
      const out = await encryptStream(input, pub, { armor: true, compress: true, signingKey, signal: controller.signal, idleMs: 60_000 });
      const done = buffer(out);
      setTimeout(() => controller.abort(reason), 50);
      await expect(done, `signed: ${Boolean(signingKey)}`).rejects.toBe(reason);
      expect(input.destroyed).toBe(true);
    }
    const aborted = AbortSignal.abort(new Error('already'));
    const input = new PassThrough();
    await expect(encryptStream(input, pub, { armor: true, signal: aborted })).rejects.toThrow('already');
    expect(input.destroyed).toBe(true);
  });

  it('compressed data in tiny partial chunks, or holding a packet in them, is refused as damaged', async () => {
    const data = randomBytes(2000);
    // Compressed ("uncompressed" algorithm) packet whose own body comes in 1-octet chunks: refused on sight.
    const lit = Buffer.concat([Buffer.from([0xcb, 0xff]), Buffer.alloc(4), literal(data)]);
    lit.writeUInt32BE(lit.length - 6, 2);
    const outer = await sealed(tinyChunks(0xc8, Buffer.concat([Buffer.from([0]), lit])));
    expect(await code(decryptAll(outer))).toBe('integrity_check_failed');
    // A well-framed compressed packet holding a literal packet in 1-octet chunks.
    const innerTiny = tinyChunks(0xcb, literal(data));
    const compressed = Buffer.concat([Buffer.from([0xc8, 0xff]), Buffer.alloc(4), Buffer.from([0]), innerTiny]);
    compressed.writeUInt32BE(1 + innerTiny.length, 2);
    expect(await code(decryptAll(await sealed(compressed)))).toBe('integrity_check_failed');
    // The same, well framed, decrypts (so the refusals above are about the framing).
    const good = Buffer.concat([Buffer.from([0xc8, 0xff]), Buffer.alloc(4), Buffer.from([0]), lit]);
    good.writeUInt32BE(1 + lit.length, 2);
    expect((await decryptAll(await sealed(good))).equals(data)).toBe(true);
  });

  it('a long marker after a password packet is refused without reading it', async () => {
    const honest = await fromOpenPGPjs(randomBytes(100));
    const length = 64 * MiB;
    const marker = Buffer.concat([Buffer.from([0xca, 0xff]), Buffer.alloc(4), Buffer.alloc(length, 0x50)]);
    marker.writeUInt32BE(length, 2);
    let at = 0; // session key packets (one-octet lengths here), then the marker, then the encrypted data
    while (honest[at] !== 0xd2) at += 2 + honest[at + 1];
    const message = Buffer.concat([honest.subarray(0, at), marker, honest.subarray(at)]);
    const { stream, state } = counting(message);
    expect(await code(decryptAll(message, stream))).toBe('malformed_message');
    expect(state.pulled).toBeLessThan(4 * MiB);
  });

  it('a storage error comes out unchanged from armored messages and those OpenPGP.js wrote too', async () => {
    const storage = Object.assign(new Error('read EIO'), { code: 'EIO' });
    for (const message of [
      armorMessage(await buffer(await encryptStream(Readable.from([randomBytes(100)]), pub, { armor: false }))),
      await fromOpenPGPjs(randomBytes(100)),
    ]) {
      for (const cut of [3, 40, 120]) {
        const failing = Readable.from(
          (async function* () {
            yield message.subarray(0, cut);
            throw storage;
          })(),
        );
        expect(await decryptAll(message, failing).catch((e: unknown) => e), `after ${cut} bytes`).toBe(storage);
      }
    }
  });

  it(
    'RSA session keys are decrypted in constant time: a PKCS#1 failure looks like any damaged message, honest ones all decrypt',
    { timeout: 60_000 },
    async () => {
      const rsa = await generateKey({ name: 'R', email: 'r@example.test', algorithm: 'rsa3072', secret: SECRET });
      const rsaPub = await readStoredPublicKey(rsa.publicArmored);
      const rsaPriv = await unlockPrivateKey(rsa.privateArmored, SECRET);
      for (const honest of [
        await buffer(await encryptStream(Readable.from([randomBytes(3000)]), rsaPub, { armor: false })),
        await fromOpenPGPjs(randomBytes(3000), rsaPub),
      ]) {
        const bad = Buffer.from(honest);
        bad[packetBody(bad, 1) + 12 + 100] ^= 0x01; // inside the RSA ciphertext (after version, key id, algorithm, MPI length)
        expect(await code(decryptAll(bad, undefined, rsaPriv))).not.toBe('no_matching_key');
      }
      // OpenPGP.js would try one candidate key per AES size in parallel and sometimes never settle: not here.
      for (let i = 0; i < 25; i++) {
        const data = randomBytes(1000);
        const message = i % 2 ? await fromOpenPGPjs(data, rsaPub) : await buffer(await encryptStream(Readable.from([data]), rsaPub, { armor: false }));
        expect((await decryptAll(message, undefined, rsaPriv, { idleMs: 2000 })).equals(data), `message ${i}`).toBe(true);
      }
    },
  );

  it('an abort while the native output is read fails it with the signal’s reason and destroys the input', async () => {
    const honest = await buffer(await encryptStream(Readable.from([randomBytes(3 * MiB)]), pub, { armor: false }));
    const input = new PassThrough();
    input.write(honest.subarray(0, 2 * MiB)); // the rest never comes: the reader waits
    const controller = new AbortController();
    const reason = new Error('job stopped');
    const out = await (await openEncrypted(input, { maxDecompressedBytes: 4 * MiB, signal: controller.signal })).decrypt(priv);
    setTimeout(() => controller.abort(reason), 100);
    await expect(buffer(out)).rejects.toBe(reason);
    expect(input.destroyed).toBe(true);
  });

  it('compressed data: two layers at most, trailing bytes after the zlib stream dropped, nothing but padding after it, the cap on each layer', async () => {
    const data = randomBytes(3000);
    const lit = Buffer.concat([Buffer.from([0xcb, 0xff]), Buffer.alloc(4), literal(data)]);
    lit.writeUInt32BE(lit.length - 6, 2);
    const compressedPacket = (algorithm: number, content: Buffer) => {
      const packed = Buffer.concat([Buffer.from([algorithm]), content]);
      const header = Buffer.from([0xc8, 0xff, 0, 0, 0, 0]);
      header.writeUInt32BE(packed.length, 2);
      return Buffer.concat([header, packed]);
    };
    const zlib = (packets: Buffer, trailing = Buffer.alloc(0)) => compressedPacket(2, Buffer.concat([deflateSync(packets), trailing]));
    expect((await decryptAll(await sealed(zlib(zlib(lit))))).equals(data)).toBe(true);
    expect(await code(decryptAll(await sealed(zlib(zlib(zlib(lit))))))).toBe('integrity_check_failed');
    // Sequoia pads inside the compressed packet, after the end of the zlib stream.
    expect((await decryptAll(await sealed(zlib(lit, randomBytes(700))))).equals(data)).toBe(true);
    // A padding packet (type 21) may follow; literal data may not.
    expect((await decryptAll(await sealed(Buffer.concat([zlib(lit), Buffer.from([0xd5, 4, 1, 2, 3, 4])])))).equals(data)).toBe(true);
    expect(await code(decryptAll(await sealed(Buffer.concat([zlib(lit), lit]))))).toBe('integrity_check_failed');
    // The cap (1 MiB here) holds for each layer, the inner one too.
    const sized = (n: number) => {
      const packet = Buffer.concat([Buffer.from([0xcb, 0xff]), Buffer.alloc(4), literal(Buffer.alloc(n))]);
      packet.writeUInt32BE(packet.length - 6, 2);
      return packet;
    };
    expect((await decryptAll(await sealed(zlib(zlib(sized(MiB - 100)))))).length).toBe(MiB - 100);
    expect(await code(decryptAll(await sealed(zlib(zlib(sized(MiB))))))).toBe('integrity_check_failed');
  });

  it('a signed list handed to OpenPGP.js to verify is held to the same framing rules (refused as damaged)', async () => {
    const data = randomBytes(64 * 1024);
    const signer = await openpgp.generateKey({ userIDs: [{ email: 's@example.test' }], curve: 'curve25519Legacy', format: 'object' });
    const keys = [{ key: signer.publicKey, fingerprint: signer.publicKey.getFingerprint() }];
    const signed = Buffer.from(
      await openpgp.sign({ message: await openpgp.createMessage({ binary: data }), signingKeys: signer.privateKey, format: 'binary' }),
    );
    const verified = async (inner: Buffer) => {
      const opened = await openEncrypted(counting(await sealed(inner)).stream, { maxDecompressedBytes: MiB, verify: { keys, require: true } });
      const out = await opened.decrypt(priv);
      return { data: await buffer(out), check: await out.signature };
    };
    const honest = await verified(signed);
    expect(honest.data.equals(data)).toBe(true);
    expect(honest.check).toMatchObject({ valid: true });
    // The same list with its literal packet in 1-octet partial chunks (OpenPGP.js took ~1 s per 100 KiB of them).
    const literalAt = packetBody(signed, 11);
    const literalStart = literalAt - 6; // a five-octet length
    expect(signed.subarray(literalStart, literalStart + 2)).toEqual(Buffer.from([0xcb, 0xff]));
    const literalEnd = literalAt + 6 + data.length;
    const tiny = Buffer.concat([signed.subarray(0, literalStart), tinyChunks(0xcb, literal(data)), signed.subarray(literalEnd)]);
    expect(await code(verified(tiny))).toBe('integrity_check_failed');
    // Compressed data inside the signed list is not handed over either.
    const literalPacket = signed.subarray(literalStart, literalEnd);
    const compressed = Buffer.concat([Buffer.from([0xc8, 0xff]), Buffer.alloc(4), Buffer.from([0]), literalPacket]);
    compressed.writeUInt32BE(1 + literalPacket.length, 2);
    const nested = Buffer.concat([signed.subarray(0, literalStart), compressed, signed.subarray(literalEnd)]);
    expect(await code(verified(nested))).toBe('integrity_check_failed');
  });

  it('refuses a message that names the key in more session key packets than it tries, before decrypting any', async () => {
    const honest = await buffer(await encryptStream(Readable.from([randomBytes(100)]), pub, { armor: false }));
    const pkesk = honest.subarray(0, 2 + honest[1]); // its session key packet (a one-octet length for curve25519)
    expect(pkesk[0]).toBe(0xc1);
    const anonymous = Buffer.from(pkesk);
    anonymous.fill(0, 3, 11); // wildcard key id: tried with every key
    for (const copies of [pkesk, anonymous]) {
      const flood = Buffer.concat([...Array<Buffer>(MAX_SESSION_KEY_TRIES).fill(copies), honest]);
      expect(await code(decryptAll(flood))).toBe('malformed_message');
      const withPassword = Buffer.concat([await passwordPacket(), flood]);
      expect(await code(decryptAll(withPassword))).toBe('malformed_message');
    }
    // A few anonymous packets besides ours are fine (of a message to another key: ours fails to open them).
    const other = await generateKey({ name: 'O', email: 'o@example.test', algorithm: 'curve25519', secret: SECRET });
    const toOther = await buffer(await encryptStream(Readable.from([Buffer.alloc(1)]), await readStoredPublicKey(other.publicArmored), { armor: false }));
    const theirs = Buffer.from(toOther.subarray(0, 2 + toOther[1]));
    theirs.fill(0, 3, 11);
    const data = randomBytes(100);
    const message = await buffer(await encryptStream(Readable.from([data]), pub, { armor: false }));
    expect((await decryptAll(Buffer.concat([theirs, theirs, message]))).equals(data)).toBe(true);
  });

  it('refuses more than a thousand packets before the encrypted data, with or without a password packet', async () => {
    const honest = await buffer(await encryptStream(Readable.from([randomBytes(100)]), pub, { armor: false }));
    const markers = Buffer.concat(Array<Buffer>(2000).fill(Buffer.from([0xca, 3, 0x50, 0x47, 0x50])));
    expect(await code(decryptAll(Buffer.concat([markers, honest])))).toBe('malformed_message');
    expect(await code(decryptAll(Buffer.concat([await passwordPacket(), markers, honest])))).toBe('malformed_message');
    // One marker is fine (RFC 9580 §5.8).
    expect(await code(decryptAll(Buffer.concat([markers.subarray(0, 5), honest])))).toBe('ok');
  });

  it('refuses an AEAD chunk size above 2^22 octets before reading the data (a chunk is read whole before it is opened)', async () => {
    const aead = await openpgp.generateKey({
      userIDs: [{ email: 'a@example.test' }],
      curve: 'curve25519Legacy',
      format: 'object',
      config: { aeadProtect: true },
    });
    const data = randomBytes(8 * MiB);
    const honest = Buffer.from(
      await openpgp.encrypt({ message: await openpgp.createMessage({ binary: data }), encryptionKeys: aead.publicKey, format: 'binary' }),
    );
    const seipd = packetBody(honest, 18);
    expect(honest[seipd]).toBe(2); // SEIPDv2: version, cipher, AEAD mode, chunk size octet
    expect((await decryptAll(honest, undefined, aead.privateKey)).equals(data)).toBe(true);
    const huge = Buffer.from(honest);
    huge[seipd + 3] = 40; // 2^46-octet chunks
    const { stream, state } = counting(huge);
    expect(await code(decryptAll(huge, stream, aead.privateKey))).toBe('malformed_message');
    expect(state.pulled).toBeLessThan(4 * MiB);
  });

  it('stops when its signal aborts', async () => {
    const honest = await buffer(await encryptStream(Readable.from([randomBytes(100)]), pub, { armor: false }));
    const controller = new AbortController();
    const reason = new Error('job stopped');
    controller.abort(reason);
    await expect(openEncrypted(counting(honest).stream, { maxDecompressedBytes: MiB, signal: controller.signal })).rejects.toBe(reason);
  });
});
