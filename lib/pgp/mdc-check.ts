import { createHash, timingSafeEqual } from 'node:crypto';
import { parentPort, workerData } from 'node:worker_threads';
import { cfbDecryptor } from './cfb';

/**
 * The thread that checks a SEIPDv1 stream's MDC for lib/pgp/mdc-thread.ts: pieces of the packet's body
 * as they come, `null` at the end; it answers `{done}` per piece and one verdict. No plaintext leaves it.
 */
const { ecb, key } = workerData as { ecb: string; key: Uint8Array };
const port = parentPort!;
const decipher = cfbDecryptor(ecb, key);
const mdc = createHash('sha1');
// The last 22 octets seen (the MDC packet: 2 header octets, hashed, and the 20-octet digest).
const tail = Buffer.alloc(22);
let tailLength = 0;
let first = true;
let failed = false;

const fail = (kind: 'unsupported' | 'malformed' | 'tampered', why: string) => {
  failed = true;
  port.postMessage({ ok: false, kind, why });
};

/** Hashes plaintext, all but the last 22 octets seen, which wait for the next piece or the end. */
const consume = (d: Buffer) => {
  if (d.length >= 22) {
    if (tailLength) mdc.update(tail.subarray(0, tailLength));
    mdc.update(d.subarray(0, d.length - 22));
    d.copy(tail, 0, d.length - 22);
    tailLength = 22;
  } else if (d.length) {
    const all = Buffer.concat([tail.subarray(0, tailLength), d]);
    if (all.length > 22) mdc.update(all.subarray(0, all.length - 22));
    tailLength = all.copy(tail, 0, Math.max(0, all.length - 22));
  }
};

port.on('message', (piece: Uint8Array | null) => {
  if (failed) return;
  if (piece === null) {
    if (first) return fail('malformed', 'the encrypted data packet is empty');
    // The prefix (18 octets) and an MDC packet at least; the prefix's quick check is not consulted (§14.4).
    if (tailLength !== 22 || tail[0] !== 0xd3 || tail[1] !== 0x14) return fail('tampered', 'no MDC packet at the end');
    mdc.update(tail.subarray(0, 2));
    if (!timingSafeEqual(mdc.digest(), tail.subarray(2))) return fail('tampered', 'MDC mismatch');
    return port.postMessage({ ok: true });
  }
  let body = Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
  const size = body.length;
  if (first) {
    first = false;
    if (body[0] !== 1) return fail('unsupported', `a version ${body[0]} encrypted data packet`);
    body = body.subarray(1);
  }
  for (const d of decipher.update(body)) consume(d);
  port.postMessage({ done: size });
});
