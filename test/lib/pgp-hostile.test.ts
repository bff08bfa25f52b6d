import { describe, expect, it, beforeAll } from 'vitest';
import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import type * as openpgp from 'openpgp';
import { generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { encryptStream, openEncrypted } from '../../lib/pgp/stream';
import { AppError } from '../../lib/errors';
import { armorMessage, flipInnerTag } from '../support/tamper';

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

const code = (p: Promise<unknown>) => p.then(() => 'ok', (err: unknown) => (err instanceof AppError ? err.code : err));

async function decryptAll(message: Buffer, input = counting(message).stream) {
  const opened = await openEncrypted(input, { maxDecompressedBytes: MiB });
  return buffer(await opened.decrypt(priv));
}

describe('hostile OpenPGP input', () => {
  it('a one-byte change that makes the inner packet an encrypted-data packet is refused at once, binary and armored', async () => {
    const honest = await buffer(await encryptStream(Readable.from([randomBytes(4096)]), pub, { armor: false }));
    for (const tampered of [flipInnerTag(honest), armorMessage(flipInnerTag(honest))]) {
      const { stream, state } = counting(tampered);
      const started = Date.now();
      expect(await code(decryptAll(tampered, stream))).toBe('malformed_message');
      expect(Date.now() - started).toBeLessThan(5000);
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
    while ((honest[at]! & 0x3f) !== 18) at += 2 + honest[at + 1]!; // PKESKs have one-octet lengths here
    const ctb = honest[at]!;
    const lenOctet = honest[at + 1]!;
    const bodyAt = lenOctet < 192 ? at + 2 : lenOctet < 224 ? at + 3 : lenOctet === 255 ? at + 6 : at + 2;
    const bodyEnd = lenOctet >= 224 && lenOctet < 255 ? honest.length : honest.length;
    const bodyBytes = honest.subarray(bodyAt, bodyEnd);
    const parts: Buffer[] = [honest.subarray(0, at), Buffer.from([ctb])];
    for (let i = 0; i < bodyBytes.length - 1; i++) parts.push(Buffer.from([0xe0, bodyBytes[i]!]));
    parts.push(Buffer.from([1, bodyBytes[bodyBytes.length - 1]!]));
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

  it('stops when its signal aborts', async () => {
    const honest = await buffer(await encryptStream(Readable.from([randomBytes(100)]), pub, { armor: false }));
    const controller = new AbortController();
    const reason = new Error('job stopped');
    controller.abort(reason);
    await expect(openEncrypted(counting(honest).stream, { maxDecompressedBytes: MiB, signal: controller.signal })).rejects.toBe(reason);
  });
});
