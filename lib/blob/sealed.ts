/**
 * Job blobs sealed at rest. Everything under `jobs/<job id>/` (uploads, outputs, a supplied public key)
 * is encrypted with a per-job data key, so a copy of the blob store alone reveals nothing. The key is
 * made with the job and kept in its row, sealed under the master key (lib/blob/data-keys.ts); a put or
 * a get of a job whose key is unknown fails.
 *
 * A sealed blob is a STREAM construction (as in age or Tink's streaming AEAD):
 *   header  "KMSB" ‖ version 0x01 ‖ salt (16 random bytes)                                  21 bytes
 *   chunks  AES-256-GCM of each 1 MiB of plaintext, 16-byte tag appended                1 MiB + 16 each
 *           then one final chunk of 0 to 1 MiB - 1 bytes (+ 16): every blob ends with a short chunk
 * The chunk key is HKDF-SHA256(data key, salt, "kms/blob/v1\0" ‖ blob key): a blob moved to another key
 * or job does not open. The nonce is the chunk index (11 bytes, big-endian) ‖ final flag (1 byte): a
 * reordered, dropped, truncated or extended blob does not open either. Each chunk is verified before
 * any of its bytes is handed on; a failure is a plain Error on the stream.
 *
 * Because only the final chunk is short, a reader knows a chunk's flag as soon as it has a whole one (or
 * the end): it never holds more than one chunk, and it never copies one together (chunks are kept as
 * references to the source's buffers and fed to one cipher per chunk).
 *
 * Keys outside `jobs/` pass through unchanged. Byte ranges of sealed blobs are refused: nothing reads
 * job blobs by range.
 */
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { rm } from 'node:fs/promises';
import { Readable } from 'node:stream';
import { singleUse } from '../single-use';
import { KEY_NAME, type JobDataKeys } from './data-keys';
import { type BlobStore, type ByteRange, type PutOptions, STREAM_CHUNK_BYTES } from './types';

const MAGIC = Buffer.from('KMSB\x01', 'latin1');
const SALT_BYTES = 16;
const SEALED_HEADER_BYTES = MAGIC.length + SALT_BYTES;
const TAG_BYTES = 16;
const CHUNK = STREAM_CHUNK_BYTES;
const SEALED_CHUNK = CHUNK + TAG_BYTES;
const UUID = '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}';
const JOB_BLOB = new RegExp(`^jobs/(${UUID})/(.+)$`);
const JOB_DIR = new RegExp(`^jobs/(${UUID})/$`);

/** Size of the sealed form of `size` plaintext bytes. */
export function sealedSize(size: number): number {
  const full = Math.floor(size / CHUNK);
  return SEALED_HEADER_BYTES + full * SEALED_CHUNK + (size - full * CHUNK) + TAG_BYTES;
}

/** Plaintext size of a sealed blob of `size` bytes, or null when no sealed blob has that size. */
export function plaintextSize(size: number): number | null {
  const body = size - SEALED_HEADER_BYTES;
  if (!Number.isSafeInteger(body) || body < TAG_BYTES) return null;
  const full = Math.floor(body / SEALED_CHUNK);
  const tail = body - full * SEALED_CHUNK;
  // The final chunk is always shorter than a full one, and never missing.
  return tail < TAG_BYTES ? null : full * CHUNK + tail - TAG_BYTES;
}

function chunkKey(dataKey: Buffer, salt: Buffer, blobKey: string): Buffer {
  return Buffer.from(hkdfSync('sha256', dataKey, salt, Buffer.from(`kms/blob/v1\0${blobKey}`), 32));
}

function nonce(index: number, final: boolean): Buffer {
  const n = Buffer.alloc(12);
  n.writeUIntBE(index, 5, 6); // an 11-byte counter of which the low 6 bytes are used (2^48 chunks)
  n[11] = final ? 1 : 0;
  return n;
}

interface Frame {
  /** The frame's bytes, as slices of the source's buffers (never copied). */
  parts: Buffer[];
  bytes: number;
  /** The source ended: this is the remainder, shorter than a frame (possibly empty). */
  last: boolean;
}

/**
 * Cuts a stream into frames of exactly `size` bytes (the first one `first` bytes), then one last frame
 * with what remains, possibly nothing. Holds at most one frame, by reference.
 */
async function* frames(source: AsyncIterable<Buffer | string>, size: number, first = size): AsyncGenerator<Frame> {
  let want = first;
  let parts: Buffer[] = [];
  let bytes = 0;
  for await (const chunk of source) {
    let buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    while (bytes + buf.length >= want) {
      const take = want - bytes;
      parts.push(buf.subarray(0, take));
      yield { parts, bytes: want, last: false };
      buf = buf.subarray(take);
      parts = [];
      bytes = 0;
      want = size;
    }
    if (buf.length > 0) {
      parts.push(buf);
      bytes += buf.length;
    }
  }
  yield { parts, bytes, last: true };
}

const joined = (parts: Buffer[]) => (parts.length === 1 ? parts[0] : Buffer.concat(parts));

/**
 * What seal and open do with each chunk they make: job blobs hand theirs on single-use (lib/single-use.ts),
 * released by the file or socket write that takes them; other callers get plain buffers.
 */
type Made = (chunk: Buffer) => Buffer;
const asMade: Made = (chunk) => chunk;

/** Seals a plaintext stream; `key` is the blob's chunk key, `salt` what derived it. */
async function* seal(source: AsyncIterable<Buffer | string>, key: Buffer, salt: Buffer, made = asMade): AsyncGenerator<Buffer> {
  yield Buffer.concat([MAGIC, salt]);
  let index = 0;
  // A full chunk is never the final one: a plaintext of whole chunks ends with an empty final chunk.
  for await (const { parts, last } of frames(source, CHUNK)) {
    const cipher = createCipheriv('aes-256-gcm', key, nonce(index++, last), { authTagLength: TAG_BYTES });
    for (const part of parts) yield made(cipher.update(part));
    cipher.final(); // GCM: no output
    yield cipher.getAuthTag();
  }
}

/**
 * Opens a sealed blob given as frames (the header, then one sealed chunk each), yielding each chunk's
 * plaintext only once its tag has been verified. Each frame is used up before the next is asked for,
 * so a reader may reuse one buffer for all of them (`BlobStore.readFrames`).
 */
async function* open(chunks: AsyncIterator<Frame>, dataKey: Buffer, blobKey: string, made = asMade): AsyncGenerator<Buffer> {
  const fail = (what: string) => new Error(`sealed blob ${blobKey}: ${what}`);
  const first = await chunks.next();
  const header = first.done ? Buffer.alloc(0) : joined(first.value.parts);
  if (header.length < SEALED_HEADER_BYTES || !header.subarray(0, MAGIC.length).equals(MAGIC)) throw fail('not a sealed blob');
  const key = chunkKey(dataKey, header.subarray(MAGIC.length), blobKey);
  let index = 0;
  let ended = false;
  for (let next = await chunks.next(); !next.done; next = await chunks.next()) {
    const { parts, bytes, last } = next.value;
    if (bytes < TAG_BYTES) throw fail(`truncated (chunk ${index} ${bytes === 0 ? 'missing' : 'cut short'})`);
    const decipher = createDecipheriv('aes-256-gcm', key, nonce(index, last), { authTagLength: TAG_BYTES });
    const plain: Buffer[] = [];
    const tag: Buffer[] = [];
    let left = bytes - TAG_BYTES;
    for (const part of parts) {
      const n = Math.min(part.length, left);
      if (n > 0) plain.push(made(decipher.update(n === part.length ? part : part.subarray(0, n))));
      if (n < part.length) tag.push(part.subarray(n));
      left -= n;
    }
    decipher.setAuthTag(joined(tag));
    try {
      decipher.final();
    } catch {
      throw fail(`chunk ${index} failed authentication (modified, reordered, truncated, extended or moved)`);
    }
    index += 1;
    for (const p of plain) if (p.length > 0) yield p;
    ended = last;
  }
  if (!ended) throw fail('truncated');
}

/**
 * The same construction for a stream that is not a job blob (a backup archive, lib/operations/backup):
 * sealed under `dataKey` and bound to `name`, so that it opens only under that name.
 */
export function sealStream(source: AsyncIterable<Buffer | string>, dataKey: Buffer, name: string): AsyncGenerator<Buffer> {
  const salt = randomBytes(SALT_BYTES);
  return seal(source, chunkKey(dataKey, salt, name), salt);
}

/** Opens what sealStream made: each chunk's plaintext once verified; a plain Error for anything changed or cut. */
export const openStream = (source: AsyncIterable<Buffer | string>, dataKey: Buffer, name: string): AsyncGenerator<Buffer> =>
  open(frames(source, SEALED_CHUNK, SEALED_HEADER_BYTES), dataKey, name);

/** Wraps a store so that job blobs are sealed at rest (see the file comment). */
export function sealedJobBlobs(inner: BlobStore, dataKeys: JobDataKeys): BlobStore {
  /** The job id of a job blob, null for keys outside `jobs/`; throws for anything else under `jobs/`. */
  function jobOf(key: string): string | null {
    if (typeof key !== 'string' || !key.startsWith('jobs/')) return null;
    const match = JOB_BLOB.exec(key);
    // Fail closed: nothing under jobs/ is stored in the clear.
    if (!match) throw new TypeError(`invalid job blob key (not jobs/<job uuid>/...): ${JSON.stringify(key)}`);
    // A legacy data key (lib/blob/data-keys.ts) is read only by the key store.
    if (match[2] === KEY_NAME) throw new TypeError(`reserved blob key: ${key}`);
    return match[1];
  }

  async function put(key: string, source: Readable, opts: PutOptions = {}): Promise<{ size: number }> {
    let jobId: string | null;
    let chunkKeyOf: { key: Buffer; salt: Buffer } | undefined;
    try {
      jobId = jobOf(key);
      if (jobId) {
        const salt = randomBytes(SALT_BYTES);
        // Derived now, before the inner store reads: a job without a key fails with nothing stored.
        chunkKeyOf = { key: chunkKey(await dataKeys.get(jobId), salt, key), salt };
      }
    } catch (err) {
      source.destroy();
      throw err;
    }
    if (!chunkKeyOf) return inner.put(key, source, opts);
    let size = 0;
    async function* counted(): AsyncGenerator<Buffer> {
      for await (const chunk of source) {
        const buf = typeof chunk === 'string' ? Buffer.from(chunk) : (chunk as Buffer);
        size += buf.length;
        opts.onProgress?.(size);
        yield buf;
      }
    }
    // Object mode: the pieces as the cipher made them (the store's write stream gathers them into one
    // writev). In byte mode each read copied a chunk and its tag together: every byte stored, once more.
    const sealed = Readable.from(seal(counted(), chunkKeyOf.key, chunkKeyOf.salt, singleUse), { objectMode: true, highWaterMark: 2 });
    try {
      await inner.put(key, sealed, { signal: opts.signal });
    } finally {
      if (!source.readableEnded) source.destroy();
    }
    return { size };
  }

  return {
    uploadTmpDir: inner.uploadTmpDir,
    put,
    async putFile(key: string, path: string) {
      if (!jobOf(key)) return inner.putFile(key, path);
      const result = await put(key, createReadStream(path, { highWaterMark: CHUNK }));
      await rm(path, { force: true });
      return result;
    },
    async get(key: string, range?: ByteRange) {
      const jobId = jobOf(key);
      if (!jobId) return inner.get(key, range);
      if (range) throw new TypeError(`byte ranges of sealed job blobs are not supported: ${key}`);
      if (inner.readFrames) {
        // One reused read buffer instead of a fresh one per read (see LocalBlobStore.readFrames).
        const read = await inner.readFrames(key, SEALED_HEADER_BYTES, SEALED_CHUNK);
        let dk: Buffer;
        try {
          dk = await dataKeys.get(jobId);
        } catch (err) {
          await read.return?.();
          throw err;
        }
        const framed: AsyncIterator<Frame> = {
          next: async () => {
            const n = await read.next();
            return n.done ? n : { done: false, value: { parts: [n.value.bytes], bytes: n.value.bytes.length, last: n.value.last } };
          },
        };
        const plain = Readable.from(open(framed, dk, key, singleUse), { objectMode: false, highWaterMark: CHUNK });
        plain.once('close', () => void read.return?.());
        return plain;
      }
      const sealed = await inner.get(key);
      let dk: Buffer;
      try {
        dk = await dataKeys.get(jobId);
      } catch (err) {
        sealed.destroy();
        throw err;
      }
      const plain = Readable.from(open(frames(sealed, SEALED_CHUNK, SEALED_HEADER_BYTES), dk, key, singleUse), { objectMode: false, highWaterMark: CHUNK });
      plain.once('close', () => sealed.destroy());
      return plain;
    },
    async stat(key: string) {
      const sealed = jobOf(key) !== null;
      const found = await inner.stat(key);
      if (!found || !sealed) return found;
      const size = plaintextSize(found.size);
      if (size === null) throw new Error(`sealed blob ${key}: ${found.size} bytes is not the size of a sealed blob (truncated?)`);
      return { size };
    },
    delete: (key) => inner.delete(key),
    async deletePrefix(prefix: string) {
      const removed = await inner.deletePrefix(prefix);
      // A job's whole folder: nothing of it is left to read, nor its key to keep.
      const job = JOB_DIR.exec(prefix)?.[1];
      if (job) dataKeys.forget(job);
      return removed;
    },
    sweepStale: (olderThan) => inner.sweepStale(olderThan),
    close: () => inner.close(),
  };
}
