/**
 * Job files a reader can follow while they are written: an upload the worker encrypts as it
 * arrives, an output the client downloads as it is produced, across processes and on any store.
 *
 * A job file (`jobs/<id>/in/<n>`, `jobs/<id>/out/<n>`) is written as a sequence of segment objects, each an
 * ordinary atomic put to the store below (sealed there, each bound to its own name):
 *   <key>.head                 the id of the write in progress (written first)
 *   <key>.<write id>.<i>       segment i: SEGMENT_BYTES of the file, the last one shorter
 *   <key>.<write id>.failed    left when the write failed, so followers stop at once
 *   <key>                      the end marker, only after the source ended cleanly: {write, segments, size}
 * A file that ends within its first INLINE_BYTES (and SEGMENT_MAX_AGE_MS) is stored whole in its end marker
 * instead ({write, size, data}, base64): no head, no segment. A small job is then one object per file where
 * it was three, and on a local store each object is a file to create and delete (see below). Such a marker has
 * no `segments`: a process of an earlier version (a rolling upgrade) finds it malformed and fails the job,
 * where it would have read zero segments as an empty file.
 * The end marker is the only "whole file" signal: `get` and `stat` see nothing before it, as with any
 * atomic put, and a follower ends only on it. A truncated, failed or rewritten file therefore never reads
 * as a complete one. Segments carry the write id in their names, so a rewrite (a job's retry) can never
 * splice its segments into a reader of the previous write: the reader fails instead.
 *
 * Segments sit beside the file, not in a folder of their own: on a local disk each folder is one more
 * inode to allocate and free per file, and on ext4 without a journal allocating an inode scans past
 * every one freed in the last minutes, which grows with a steady flow of small jobs.
 *
 * Other keys pass through unchanged.
 */
import { randomBytes } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { rm } from 'node:fs/promises';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { ONE_PIECE, readText } from '../streams';
import { type BlobStore, type FollowOptions, type PutOptions, BlobNotFoundError, STREAM_CHUNK_BYTES } from './types';

/**
 * Plaintext per segment: how far a follower trails a fast writer, at most. 8 MiB less 4 KiB, so that a
 * sealed segment stays under the S3 store's 8 MiB part size (one PutObject, not a multipart upload); at
 * 4 MiB the end-to-end bench was slower (more objects and waits per GiB).
 */
const SEGMENT_BYTES = (8 << 20) - 4096;
/** A segment that has held bytes this long is published, so a slow upload is followed as it trickles in. */
const SEGMENT_MAX_AGE_MS = 500;
const FILE_BLOB = /^jobs\/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\/(in|out)\/\d{1,5}$/;
const WRITE_ID = /^[0-9a-f]{32}$/;
/** Files up to this size are kept in their end marker (base64), which stays under SMALL_BYTES of the local store. */
const INLINE_BYTES = 32 * 1024;
const MARKER_MAX_BYTES = 48 * 1024;
/** A follower polls for the next segment with this back-off (no notification channel in the blob layer). */
const POLL_FIRST_MS = 2;
const POLL_MAX_MS = 200;
const DEFAULT_IDLE_MS = 60_000;

const headKey = (key: string) => `${key}.head`;
const partKey = (key: string, write: string, i: number) => `${key}.${write}.${i}`;
const failedKey = (key: string, write: string) => `${key}.${write}.failed`;

/** The end marker as stored: segmented, or inline (a small file's bytes, base64, and no `segments`). */
type EndMarker = { write: string; size: number } & ({ segments: number; data?: undefined } | { data: string; segments?: undefined });

const isFollowableKey = (key: string) => typeof key === 'string' && FILE_BLOB.test(key);

export interface FollowableOptions {
  /** Smaller segments for tests (above INLINE_BYTES). */
  segmentBytes?: number;
}

/** The stack job code sees: every store, plus `follow` for job files. */
export type JobBlobStore = BlobStore & Required<Pick<BlobStore, 'follow'>>;

export function followableJobFiles(inner: BlobStore, opts: FollowableOptions = {}): JobBlobStore {
  const segmentBytes = opts.segmentBytes ?? SEGMENT_BYTES;

  /** A marker's text, or undefined when it does not exist. */
  async function readMarker(key: string): Promise<string | undefined> {
    try {
      return await readText(await inner.get(key), MARKER_MAX_BYTES);
    } catch (err) {
      if (err instanceof BlobNotFoundError) return undefined;
      throw err;
    }
  }

  /** The end marker (an inline file: no segments, its bytes decoded); undefined when the file has not ended. */
  async function readEnd(key: string): Promise<{ write: string; segments: number; size: number; inline?: Buffer } | undefined> {
    const raw = await readMarker(key);
    if (raw === undefined) return undefined;
    const m = JSON.parse(raw) as { write?: unknown; segments?: unknown; size?: unknown; data?: unknown };
    const inline = typeof m.data === 'string' ? Buffer.from(m.data, 'base64') : undefined;
    const write = typeof m.write === 'string' && WRITE_ID.test(m.write) ? m.write : undefined;
    const size = Number.isSafeInteger(m.size) && (m.size as number) >= 0 ? (m.size as number) : undefined;
    const segmented = m.data === undefined && Number.isSafeInteger(m.segments) && (m.segments as number) >= 0;
    const whole = inline !== undefined && m.segments === undefined && inline.length === size && inline.toString('base64') === m.data;
    if (write === undefined || size === undefined || !(segmented || whole)) throw new Error(`blob ${key}: malformed end marker`);
    return { write, size, segments: segmented ? (m.segments as number) : 0, inline };
  }

  async function readHead(key: string): Promise<string | undefined> {
    const raw = await readMarker(headKey(key));
    if (raw !== undefined && !WRITE_ID.test(raw)) throw new Error(`blob ${key}: malformed head marker`);
    return raw;
  }

  const putSmall = (key: string, text: string) => inner.put(key, Readable.from([Buffer.from(text)]));

  /** The writes whose segments may still be stored for `key`: its end marker's (with its count) and its head's. */
  async function writesOf(key: string): Promise<{ write: string; segments?: number }[]> {
    const [end, head] = await Promise.all([readEnd(key).catch(() => undefined), readHead(key).catch(() => undefined)]);
    const writes: { write: string; segments?: number }[] = end ? [end] : [];
    if (head && head !== end?.write) writes.push({ write: head });
    return writes;
  }

  const deleteSegments = (key: string, write: string, count: number) =>
    Promise.all(Array.from({ length: count }, (_, i) => inner.delete(partKey(key, write, i))));

  /**
   * Deletes the segments of a write and its failed marker. Without a count (a write that never ended:
   * one that failed deleted its own, one that crashed did not) segments are looked for until one is missing.
   */
  async function deleteWrite(key: string, write: string, segments?: number): Promise<void> {
    let count = segments ?? 0;
    if (segments === undefined) while (await inner.stat(partKey(key, write, count))) count += 1;
    await Promise.all([deleteSegments(key, write, count), inner.delete(failedKey(key, write))]);
  }

  async function put(key: string, source: Readable, putOpts: PutOptions = {}): Promise<{ size: number }> {
    // The source's iterator listens for its errors only from its first read, after the markers below: a
    // source that fails before (a client gone) must not raise an uncaught 'error'; that read reports it.
    source.on('error', () => undefined);
    const it = source[Symbol.asyncIterator]() as AsyncIterator<Buffer | string>;
    const write = randomBytes(16).toString('hex');
    const previous = putOpts.fresh ? [] : await writesOf(key).catch(() => []);
    let pending: Promise<IteratorResult<Buffer | string>> | undefined;
    let carry: Buffer | undefined;
    let ended = false;
    let size = 0;
    /** The next piece of the source; undefined at its end, or when `waitMs` passed first (the piece stays pending). */
    const next = async (waitMs?: number): Promise<Buffer | undefined> => {
      if (carry) {
        const c = carry;
        carry = undefined;
        return c;
      }
      pending ??= it.next();
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<undefined>((resolve) => (timer = waitMs === undefined ? undefined : setTimeout(() => resolve(undefined), waitMs)));
      const n = await (waitMs === undefined ? pending : Promise.race([pending, timeout]));
      clearTimeout(timer);
      if (!n) return undefined;
      pending = undefined;
      if (n.done) {
        ended = true;
        return undefined;
      }
      return typeof n.value === 'string' ? Buffer.from(n.value) : n.value;
    };
    /** One segment: full, or shorter at the end of the source or when it has been open SEGMENT_MAX_AGE_MS (a slow upload). */
    async function* segment(): AsyncGenerator<Buffer> {
      const opened = Date.now();
      for (let left = segmentBytes; left > 0;) {
        let chunk = await next(left < segmentBytes ? Math.max(0, opened + SEGMENT_MAX_AGE_MS - Date.now()) : undefined);
        if (!chunk) return;
        if (chunk.length > left) {
          carry = chunk.subarray(left);
          chunk = chunk.subarray(0, left);
        }
        left -= chunk.length;
        size += chunk.length;
        putOpts.onProgress?.(size);
        yield chunk;
      }
    }
    /**
     * The whole source when it ends within INLINE_BYTES while its first segment is young; otherwise
     * undefined, with what was read handed to the first segment (`carry`).
     */
    async function wholeIfSmall(): Promise<Buffer | undefined> {
      const opened = Date.now();
      const parts: Buffer[] = [];
      let held = 0;
      while (held <= INLINE_BYTES) {
        const chunk = await next(Math.max(0, opened + SEGMENT_MAX_AGE_MS - Date.now()));
        if (!chunk) break;
        parts.push(chunk);
        held += chunk.length;
      }
      const all = parts.length === 1 ? parts[0] : Buffer.concat(parts);
      if (ended && held <= INLINE_BYTES) return all;
      if (held > 0) carry = all;
      return undefined;
    }
    let segments = 0;
    let headed = false;
    try {
      const whole = await wholeIfSmall();
      // The old end marker goes first: from now on nobody may take the old write for the file.
      if (!putOpts.fresh) await inner.delete(key);
      if (whole) {
        size = whole.length;
        putOpts.onProgress?.(size);
        await putSmall(key, JSON.stringify({ write, size, data: whole.toString('base64') } satisfies EndMarker));
        // Whole before anyone is told of it: a follower never waits on a write that could fail unseen.
        await putOpts.onOpen?.().catch(async (err: unknown) => {
          await inner.delete(key).catch(() => undefined);
          throw err;
        });
      } else {
        await putSmall(headKey(key), write);
        headed = true;
        await putOpts.onOpen?.();
        while (!ended) {
          putOpts.signal?.throwIfAborted();
          // Look ahead one piece: a file of whole segments ends without an empty segment after them.
          if (segments > 0 && !(carry = await next())) break;
          await inner.put(partKey(key, write, segments), Readable.from(segment(), ONE_PIECE), { signal: putOpts.signal });
          segments += 1;
        }
        await putSmall(key, JSON.stringify({ write, segments, size } satisfies EndMarker));
      }
    } catch (err) {
      pending?.catch(() => undefined); // a read of the source still under way fails with it: not unhandled
      source.destroy();
      // Followers know this write only from its head.
      if (headed) await putSmall(failedKey(key, write), 'failed').catch(() => undefined);
      // Segments go; the failed marker stays until the job's folder is deleted, for late followers.
      await deleteSegments(key, write, segments).catch(() => undefined);
      throw err;
    }
    // An inline write has no head of its own: an earlier write's would name a write that is gone.
    if (!headed && previous.length) await inner.delete(headKey(key)).catch(() => undefined);
    await Promise.all(previous.filter((w) => w.write !== write).map((w) => deleteWrite(key, w.write, w.segments).catch(() => undefined)));
    return { size };
  }

  /**
   * The file's bytes, segment after segment. With `wait` the segments of a write in progress are
   * followed as they appear; without it the file must be complete (BlobNotFoundError otherwise).
   */
  async function read(key: string, wait: FollowOptions | undefined): Promise<Readable> {
    let end = await readEnd(key);
    if (!end && !wait) throw new BlobNotFoundError(key);
    const idleMs = wait?.idleMs ?? DEFAULT_IDLE_MS;
    const startMs = wait?.startMs ?? idleMs;
    const signal = wait?.signal;
    async function* segments(): AsyncGenerator<Buffer> {
      let write = end?.write;
      let idleSince = Date.now();
      let delay = POLL_FIRST_MS;
      const pause = async (why: string) => {
        const limit = write ? idleMs : startMs;
        if (Date.now() - idleSince > limit) throw new Error(`blob ${key}: nothing new for ${limit} ms (${why})`);
        wait?.slot?.release();
        await sleep(delay, undefined, { signal });
        delay = Math.min(delay * 2, POLL_MAX_MS);
      };
      for (let i = 0; ;) {
        signal?.throwIfAborted();
        if (end && i >= end.segments) {
          if (end.inline?.length) {
            await wait?.slot?.acquire(signal);
            yield end.inline;
          }
          return;
        }
        if (!write) {
          end = await readEnd(key);
          write = end?.write ?? (await readHead(key));
          if (!write && wait?.begun) throw new Error(`blob ${key} is gone (deleted before it was read)`);
          if (!write) await pause('not started');
          else idleSince = Date.now(); // the writer's pace is timed from when it began
          continue;
        }
        let part: Readable | undefined;
        try {
          part = await inner.get(partKey(key, write, i));
        } catch (err) {
          if (!(err instanceof BlobNotFoundError)) throw err;
        }
        if (part) {
          await wait?.slot?.acquire(signal);
          for await (const chunk of part) yield chunk as Buffer;
          i += 1;
          idleSince = Date.now();
          delay = POLL_FIRST_MS;
          continue;
        }
        // Segment i is not there (yet): the write ended, failed, was replaced, or is still going.
        end ??= await readEnd(key);
        if (end) {
          if (end.write !== write) throw new Error(`blob ${key} was rewritten while it was read`);
          if (i >= end.segments) continue;
          throw new Error(`blob ${key}: segment ${i} of ${end.segments} is missing`);
        }
        if (!wait) throw new Error(`blob ${key}: segment ${i} is missing`);
        if ((await readMarker(failedKey(key, write))) !== undefined) throw new Error(`blob ${key}: its writer failed`);
        const head = await readHead(key);
        if (head !== write) {
          // The end marker may have been published between the two reads above.
          if ((end = await readEnd(key))?.write === write) continue;
          throw new Error(`blob ${key} was ${head ? 'rewritten' : 'deleted'} while it was read`);
        }
        await pause('waiting for the writer');
      }
    }
    return Readable.from(segments(), { objectMode: false, highWaterMark: STREAM_CHUNK_BYTES });
  }

  return {
    uploadTmpDir: inner.uploadTmpDir,
    put: (key, source, putOpts) => (isFollowableKey(key) ? put(key, source, putOpts) : inner.put(key, source, putOpts)),
    async putFile(key, path) {
      if (!isFollowableKey(key)) return inner.putFile(key, path);
      const result = await put(key, createReadStream(path, { highWaterMark: STREAM_CHUNK_BYTES }));
      await rm(path, { force: true });
      return result;
    },
    async get(key, range) {
      if (!isFollowableKey(key)) return inner.get(key, range);
      if (range) throw new TypeError(`byte ranges of job files are not supported: ${key}`);
      return read(key, undefined);
    },
    follow: (key, followOpts = {}) => (isFollowableKey(key) ? read(key, followOpts) : inner.get(key)),
    async stat(key) {
      if (!isFollowableKey(key)) return inner.stat(key);
      const end = await readEnd(key);
      return end ? { size: end.size } : null;
    },
    async delete(key) {
      if (!isFollowableKey(key)) return inner.delete(key);
      const writes = await writesOf(key);
      await inner.delete(key);
      await inner.delete(headKey(key));
      await Promise.all(writes.map((w) => deleteWrite(key, w.write, w.segments)));
    },
    deletePrefix: (prefix) => inner.deletePrefix(prefix),
    sweepStale: (olderThan) => inner.sweepStale(olderThan),
    close: () => inner.close(),
  };
}
