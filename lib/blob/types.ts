/**
 * The blob store contract shared by the local-folder and S3 drivers, plus the key rules and the
 * byte counter both drivers use. Blobs are opaque byte streams addressed by a relative key such as
 * `jobs/<uuid>/out/0`; nothing here ever holds a whole blob in memory.
 */
import type { Readable } from 'node:stream';
import type { Slot } from '../slots';

/** Stream chunk size used for files and pipes: large enough for throughput, small enough to keep memory flat. */
export const STREAM_CHUNK_BYTES = 1 << 20;

export interface PutOptions {
  /** Called with the running total of bytes read from the source. Callers throttle it if needed. */
  onProgress?: (bytes: number) => void;
  /** Aborting rejects the put and leaves nothing behind, like any other source error. */
  signal?: AbortSignal;
  /**
   * Followable job files (lib/blob/followable.ts): awaited once the object can be followed and before any
   * of its bytes is stored (a small file, stored whole in one object: once it is); an error fails the put
   * and leaves nothing stored.
   */
  onOpen?(): Promise<void>;
  /**
   * Followable job files: no earlier write of this key can exist (an input of a new job, the outputs of
   * a job's first attempt), so none is looked for to be replaced: 3 fewer store operations per file.
   */
  fresh?: boolean;
}

/** Inclusive byte range, as in HTTP `Range: bytes=start-end`; `end` defaults to the last byte. */
export interface ByteRange {
  start: number;
  end?: number;
}

export interface FollowOptions {
  /** Aborting stops the reader (the stream errors). */
  signal?: AbortSignal;
  /** Give up when nothing new appeared for this long (a writer that crashed), default 60 s. */
  idleMs?: number;
  /**
   * Give up when no write has begun for this long, default `idleMs`. A job's later output begins only
   * once the job has done the earlier ones: its follower waits up to the job's own time limit.
   */
  startMs?: number;
  /**
   * Whoever told the reader of this file saw its write begin (a job's input row is written once its put
   * has opened): finding no write then means the file was deleted (its job failed), not that its write
   * is still to start, and the reader fails at once rather than after `startMs`.
   */
  begun?: boolean;
  /** A worker slot the reader gives back while it waits for the writer, and takes again before it passes bytes on. */
  slot?: Slot;
}

export interface BlobStore {
  /**
   * Stream `source` into `key`. Atomic: the object becomes visible (replacing any previous one) only
   * if `source` ends without error; on error nothing is left behind (temp file deleted, multipart
   * upload aborted) and the error is rethrown. Resolves to the number of bytes written.
   */
  put(key: string, source: Readable, opts?: PutOptions): Promise<{ size: number }>;
  /**
   * Move an existing local file (e.g. one a multipart parser wrote into `uploadTmpDir`) into the
   * store; the file is gone afterwards. On failure the file is left where it was.
   */
  putFile(key: string, path: string): Promise<{ size: number }>;
  /**
   * Readable stream of the object, or of `range` of it (which should lie within the object: check with
   * `stat`). Rejects with BlobNotFoundError when the object does not exist.
   */
  get(key: string, range?: ByteRange): Promise<Readable>;
  /** Size of the object, or null when it does not exist. */
  stat(key: string): Promise<{ size: number } | null>;
  /** Delete one object; deleting a missing object is fine. */
  delete(key: string): Promise<void>;
  /**
   * Delete every object under `prefix`, which must end with `/` (e.g. `jobs/<id>/`) so that
   * `jobs/1/` never matches `jobs/10/...`. Resolves to the number of objects deleted.
   */
  deletePrefix(prefix: string): Promise<number>;
  /**
   * Local directory where upload parsers may write temp files before `putFile`. The local driver
   * keeps it inside its root so that `putFile` is a rename on the same filesystem.
   */
  readonly uploadTmpDir: string;
  /**
   * Removes what crashed writers left behind before `olderThan`: temporary files, incomplete multipart
   * uploads. Resolves to the number removed.
   */
  sweepStale(olderThan: Date): Promise<number>;
  /** Release clients and sockets. */
  close(): Promise<void>;
  /**
   * Optional fast path for decorators that consume each piece at once (lib/blob/sealed.ts): the object
   * as pieces of exactly `first` bytes, then `size` bytes each, then what remains (possibly nothing),
   * all read into ONE reused buffer. A piece is valid only until the next one is asked for. `return()`
   * releases the file, also before the first piece. Rejects with BlobNotFoundError like `get`.
   */
  readFrames?(key: string, first: number, size: number): Promise<AsyncIterableIterator<Frame>>;
  /**
   * Readable of an object that may still be being written, here or in another process (job files:
   * lib/blob/followable.ts): its bytes as they are written, waiting for more until the write ends; an
   * error if the write fails, the object is rewritten or deleted, `signal` aborts or nothing new appears
   * for `idleMs`. Stores without it are read with `get` once the object is complete.
   */
  follow?(key: string, opts?: FollowOptions): Promise<Readable>;
}

/** A piece from `readFrames`; `last` marks the remainder after which the object ends (shorter than `size`). */
export interface Frame {
  bytes: Buffer;
  last: boolean;
}

export class BlobNotFoundError extends Error {
  readonly code = 'blob_not_found';
  constructor(readonly key: string) {
    super(`blob not found: ${key}`);
    this.name = 'BlobNotFoundError';
  }
}

const KEY_CHARS = /^[A-Za-z0-9._/-]+$/;
const MAX_KEY_LENGTH = 512;

/**
 * A key is a relative path of non-empty segments from [A-Za-z0-9._-]. No segment may start with a
 * dot: that rules out `.` and `..` (a key can never escape the root) and reserves dot-names such as
 * the local driver's `.tmp/` for the store itself.
 */
export function isValidKey(key: string): boolean {
  return (
    typeof key === 'string' &&
    key.length <= MAX_KEY_LENGTH &&
    KEY_CHARS.test(key) &&
    key.split('/').every((segment) => segment.length > 0 && segment.length <= 255 && !segment.startsWith('.'))
  );
}

export function assertValidKey(key: string): void {
  if (!isValidKey(key)) throw new TypeError(`invalid blob key: ${JSON.stringify(key)}`);
}

/** A prefix is a valid key followed by `/`. Returns the prefix without the trailing slash. */
export function assertValidPrefix(prefix: string): string {
  const dir = typeof prefix === 'string' && prefix.endsWith('/') ? prefix.slice(0, -1) : '';
  if (!isValidKey(dir)) throw new TypeError(`invalid blob prefix (must be a key ending with "/"): ${JSON.stringify(prefix)}`);
  return dir;
}

export function assertValidRange(range: ByteRange): void {
  const { start, end } = range;
  const ok = Number.isSafeInteger(start) && start >= 0 && (end === undefined || (Number.isSafeInteger(end) && end >= start));
  if (!ok) throw new RangeError(`invalid byte range: ${JSON.stringify(range)}`);
}

/**
 * A pass-through stage that counts bytes as they flow, for size and progress without buffering.
 * `stage` fits both `stream.pipeline` and `Readable.from`.
 */
export function byteCounter(onProgress?: (bytes: number) => void) {
  const counter = {
    bytes: 0,
    async *stage(this: void, source: AsyncIterable<Uint8Array | string>): AsyncGenerator<Uint8Array> {
      for await (const chunk of source) {
        const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
        counter.bytes += buf.byteLength;
        onProgress?.(counter.bytes);
        yield buf;
      }
    },
  };
  return counter;
}

/** Node's error code (`ENOENT`...) of an unknown thrown value. */
export const errorCode = (err: unknown): string | undefined => (err instanceof Error && 'code' in err && typeof err.code === 'string' ? err.code : undefined);
