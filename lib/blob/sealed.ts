/**
 * Job blobs sealed at rest. Everything under `jobs/<job id>/` (uploads, outputs, a supplied public key)
 * is encrypted with a per-job data key, so a copy of the blob store alone reveals nothing: the data key
 * lives beside the blobs as `jobs/<id>/key`, sealed under the master key with the job id as AAD.
 *
 * A sealed blob is a STREAM construction (as in age or Tink's streaming AEAD):
 *   header  "KMSB" ‖ version 1 ‖ salt (16 random bytes)
 *   chunks  AES-256-GCM of each 1 MiB of plaintext (the last one shorter, possibly empty), tag appended
 * The chunk key is HKDF-SHA256(data key, salt, "kms/blob/v1" ‖ blob key), so a blob moved to another key
 * or job does not open; the nonce is the chunk index (11 bytes) and a final-chunk flag (1 byte), so
 * reordered, dropped, truncated or extended chunks do not open either. Each chunk is verified before
 * any of its bytes is handed on. Keys outside `jobs/` pass through unchanged.
 */
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import type { Sealer } from '../sealer';
import { type BlobStore, type ByteRange, type PutOptions, STREAM_CHUNK_BYTES } from './types';

const MAGIC = Buffer.from('KMSB\x01', 'latin1');
const SALT_BYTES = 16;
const HEADER_BYTES = MAGIC.length + SALT_BYTES;
const TAG_BYTES = 16;
const CHUNK = STREAM_CHUNK_BYTES;
const SEALED_CHUNK = CHUNK + TAG_BYTES;
const JOB_KEY = /^jobs\/([0-9a-f-]{36})\/(.+)$/;
const KEY_CACHE_SIZE = 256;

export const dataKeyAad = (jobId: string) => `job-data-key:${jobId}`;

/** Plaintext size of a sealed blob of `size` bytes (header, then chunks of CHUNK + tag). */
export function plaintextSize(size: number): number {
  const body = size - HEADER_BYTES;
  const chunks = Math.max(1, Math.ceil(body / SEALED_CHUNK));
  return body - chunks * TAG_BYTES;
}

function chunkKey(dataKey: Buffer, salt: Buffer, blobKey: string): Buffer {
  return Buffer.from(hkdfSync('sha256', dataKey, salt, Buffer.from(`kms/blob/v1\0${blobKey}`), 32));
}

function nonce(index: number, final: boolean): Buffer {
  const n = Buffer.alloc(12);
  n.writeUIntBE(index, 5, 6); // 11 counter bytes, the low 6 used (2^48 chunks)
  n[11] = final ? 1 : 0;
  return n;
}

/**
 * Re-cuts a stream into pieces of exactly `size` bytes (the first of `first` bytes, the last one
 * shorter and possibly empty), copying each byte once.
 */
async function* pieces(source: AsyncIterable<Buffer>, size: number, first = size): AsyncGenerator<Buffer> {
  let want = first;
  let buf = Buffer.allocUnsafe(want);
  let used = 0;
  for await (const chunk of source) {
    for (let at = 0; at < chunk.length; ) {
      const n = Math.min(want - used, chunk.length - at);
      chunk.copy(buf, used, at, at + n);
      used += n;
      at += n;
      if (used === want) {
        yield buf;
        want = size;
        buf = Buffer.allocUnsafe(want);
        used = 0;
      }
    }
  }
  yield buf.subarray(0, used);
}

/** Each piece with whether it is the last (one piece of lookahead). */
async function* withLast(source: AsyncGenerator<Buffer>): AsyncGenerator<[Buffer, boolean]> {
  let held: Buffer | undefined;
  for await (const piece of source) {
    if (held) yield [held, false];
    held = piece;
  }
  if (held) yield [held, true];
}

async function* seal(source: Readable, dataKey: Buffer, blobKey: string): AsyncGenerator<Buffer> {
  const salt = randomBytes(SALT_BYTES);
  const key = chunkKey(dataKey, salt, blobKey);
  yield Buffer.concat([MAGIC, salt]);
  let index = 0;
  for await (const [piece, last] of withLast(pieces(source, CHUNK))) {
    // A full final piece is followed by nothing: `pieces` yields an empty tail, which becomes the final chunk.
    const cipher = createCipheriv('aes-256-gcm', key, nonce(index++, last), { authTagLength: TAG_BYTES });
    yield Buffer.concat([cipher.update(piece), cipher.final(), cipher.getAuthTag()]);
  }
}

async function* open(source: Readable, dataKey: Buffer, blobKey: string): AsyncGenerator<Buffer> {
  const chunks = pieces(source, SEALED_CHUNK, HEADER_BYTES);
  const first = await chunks.next();
  const head = first.done ? Buffer.alloc(0) : first.value;
  if (head.length < HEADER_BYTES || !head.subarray(0, MAGIC.length).equals(MAGIC)) throw new Error(`sealed blob ${blobKey}: not a sealed blob`);
  const key = chunkKey(dataKey, head.subarray(MAGIC.length), blobKey);
  let index = 0;
  for await (const [sealed, last] of withLast(chunks)) {
    if (sealed.length < TAG_BYTES) throw new Error(`sealed blob ${blobKey}: truncated`);
    const decipher = createDecipheriv('aes-256-gcm', key, nonce(index++, last), { authTagLength: TAG_BYTES });
    decipher.setAuthTag(sealed.subarray(sealed.length - TAG_BYTES));
    let plain: Buffer;
    try {
      plain = Buffer.concat([decipher.update(sealed.subarray(0, sealed.length - TAG_BYTES)), decipher.final()]);
    } catch {
      throw new Error(`sealed blob ${blobKey}: chunk ${index - 1} failed authentication (modified, reordered, truncated or moved)`);
    }
    if (plain.length) yield plain;
  }
}

/** Wraps a store so that job blobs are sealed at rest (see the file comment). */
export function sealedJobBlobs(inner: BlobStore, sealer: Sealer): BlobStore {
  // A small LRU of job id → data key. Promises, so that concurrent puts of one job (several files of
  // one upload) share one key instead of racing to create two.
  const keys = new Map<string, Promise<Buffer>>();
  const keyBlob = (jobId: string) => `jobs/${jobId}/key`;

  async function load(jobId: string, create: boolean): Promise<Buffer> {
    if (await inner.stat(keyBlob(jobId))) {
      const text = Buffer.concat(await (await inner.get(keyBlob(jobId))).toArray()).toString('utf8');
      return sealer.open(text, dataKeyAad(jobId));
    }
    if (!create) throw new Error(`job ${jobId} has no data key: its blobs cannot be read`);
    const key = randomBytes(32);
    // The API's upload writes a job's first blob; workers only add outputs to jobs that have a key.
    await inner.put(keyBlob(jobId), Readable.from([Buffer.from(sealer.seal(key, dataKeyAad(jobId)))]));
    return key;
  }

  function dataKey(jobId: string, create: boolean): Promise<Buffer> {
    let key = keys.get(jobId);
    keys.delete(jobId);
    if (!key) {
      key = load(jobId, create);
      key.catch(() => keys.delete(jobId));
    }
    keys.set(jobId, key);
    if (keys.size > KEY_CACHE_SIZE) keys.delete(keys.keys().next().value!);
    return key;
  }

  const jobOf = (key: string) => {
    const match = JOB_KEY.exec(key);
    return match && match[2] !== 'key' ? match[1]! : null;
  };

  return {
    uploadTmpDir: inner.uploadTmpDir,
    async put(key: string, source: Readable, opts: PutOptions = {}) {
      const jobId = jobOf(key);
      if (!jobId) return inner.put(key, source, opts);
      let size = 0;
      const counted = Readable.from(
        (async function* () {
          for await (const c of source) {
            size += (c as Buffer).length;
            opts.onProgress?.(size);
            yield c as Buffer;
          }
        })(),
        { objectMode: false, highWaterMark: CHUNK },
      );
      const dk = await dataKey(jobId, true);
      await inner.put(key, Readable.from(seal(counted, dk, key), { objectMode: false, highWaterMark: CHUNK }), { signal: opts.signal });
      return { size };
    },
    async putFile(key: string, path: string) {
      if (!jobOf(key)) return inner.putFile(key, path);
      const { createReadStream } = await import('node:fs');
      const { rm } = await import('node:fs/promises');
      const result = await this.put(key, createReadStream(path, { highWaterMark: CHUNK }));
      await rm(path, { force: true });
      return result;
    },
    async get(key: string, range?: ByteRange) {
      const jobId = jobOf(key);
      if (!jobId) return inner.get(key, range);
      if (range) throw new TypeError('byte ranges of sealed job blobs are not supported');
      const sealed = await inner.get(key);
      const dk = await dataKey(jobId, false).catch((err: unknown) => {
        sealed.destroy();
        throw err;
      });
      const plain = Readable.from(open(sealed, dk, key), { objectMode: false, highWaterMark: CHUNK });
      plain.once('close', () => sealed.destroy());
      return plain;
    },
    async stat(key: string) {
      const found = await inner.stat(key);
      return found && jobOf(key) ? { size: plaintextSize(found.size) } : found;
    },
    delete: (key) => inner.delete(key),
    deletePrefix: (prefix) => inner.deletePrefix(prefix),
    sweepStale: (olderThan) => inner.sweepStale(olderThan),
    close: () => inner.close(),
  };
}
