/**
 * Blob store in a local folder. Layout under the root:
 *   <key>        published objects
 *   .tmp/        in-progress writes, renamed into place once complete (same filesystem: atomic)
 *   .uploads/    `uploadTmpDir`, where upload parsers write before `putFile` renames
 *   .spare/      files of deleted objects kept for later writes to overwrite (SpareFiles)
 * Keys never start a segment with a dot, so these names cannot collide with objects.
 */
import { randomUUID } from 'node:crypto';
import {
  closeSync,
  createReadStream,
  fstatSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  read,
  readSync,
  readdirSync,
  renameSync,
  rmSync,
  rmdirSync,
  statSync,
  unlinkSync,
  writeFileSync,
  writev,
} from 'node:fs';
import { lstat, readdir, rm } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { promisify } from 'node:util';
import { release } from '../single-use';
import {
  type BlobStore,
  type ByteRange,
  type Frame,
  type PutOptions,
  BlobNotFoundError,
  STREAM_CHUNK_BYTES,
  assertValidKey,
  assertValidPrefix,
  assertValidRange,
  byteCounter,
  errorCode,
} from './types';

/**
 * Objects up to this size are written and read in one synchronous call each; so are opening, stat,
 * mkdir, rename and unlink. An fs call through libuv's thread pool costs two hand-offs between threads,
 * several times what the call itself costs on a local disk: a small job's markers, data key and
 * segments would make the thread pool a large share of its CPU (docs/performance.md).
 * Streams of data stay asynchronous. This store is for a local disk: on a network filesystem that
 * stalls, these calls would stall the process.
 */
export const SMALL_BYTES = 64 * 1024;

const readAsync = promisify(read);

export interface LocalBlobStoreOptions {
  /** Bytes of deleted objects' files kept for later writes (SpareFiles); 0 deletes them at once. */
  spareBytes?: number;
}

export class LocalBlobStore implements BlobStore {
  readonly root: string;
  readonly uploadTmpDir: string;
  private readonly tmpDir: string;
  private readonly spareDir: string;
  private readonly spares: SpareFiles;

  /** Creates the root and its working folders synchronously: this runs once at startup. */
  constructor(root: string, opts: LocalBlobStoreOptions = {}) {
    this.root = resolve(root);
    this.tmpDir = join(this.root, '.tmp');
    this.uploadTmpDir = join(this.root, '.uploads');
    mkdirSync(this.tmpDir, { recursive: true });
    mkdirSync(this.uploadTmpDir, { recursive: true });
    this.spareDir = join(this.root, '.spare');
    this.spares = new SpareFiles(this.spareDir, opts.spareBytes ?? DEFAULT_SPARE_BYTES);
  }

  async put(key: string, source: Readable, opts: PutOptions = {}): Promise<{ size: number }> {
    const dest = this.pathOf(key);
    const tmp = this.tmpPath();
    const counter = byteCounter(opts.onProgress);
    try {
      await pipeline(source, counter.stage, new FileSink(tmp, this.spares), { signal: opts.signal });
      publish(tmp, dest);
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
    return { size: counter.bytes };
  }

  async putFile(key: string, path: string): Promise<{ size: number }> {
    const dest = this.pathOf(key);
    const info = statSync(path);
    if (!info.isFile()) throw new TypeError(`not a regular file: ${path}`);
    try {
      publish(path, dest);
      return { size: info.size };
    } catch (err) {
      if (errorCode(err) !== 'EXDEV') throw err;
    }
    // Different filesystem: copy (atomically, via put) then remove the original.
    const result = await this.put(key, createReadStream(path, { highWaterMark: STREAM_CHUNK_BYTES }));
    await rm(path, { force: true });
    return result;
  }

  async get(key: string, range?: ByteRange): Promise<Readable> {
    if (range) assertValidRange(range);
    const { fd, size } = this.openFile(key);
    if (size > SMALL_BYTES) return createReadStream('', { fd, start: range?.start, end: range?.end, highWaterMark: STREAM_CHUNK_BYTES });
    const buf = Buffer.allocUnsafe(size);
    let have = 0;
    try {
      for (let n = 1; have < size && n > 0; have += n) n = readSync(fd, buf, have, size - have, have);
    } finally {
      closeSync(fd);
    }
    // What was read, never the unread (uninitialised) rest, should the file have been cut meanwhile.
    const bytes = buf.subarray(0, have);
    const part = range ? bytes.subarray(range.start, range.end === undefined ? have : range.end + 1) : bytes;
    return Readable.from(part.length ? [part] : [], { objectMode: false });
  }

  /** Opens an object for reading: a missing object throws here rather than as a stream error later. */
  private openFile(key: string): { fd: number; size: number } {
    let fd: number;
    try {
      fd = openSync(this.pathOf(key), 'r');
    } catch (err) {
      throw errorCode(err) === 'ENOENT' || errorCode(err) === 'ENOTDIR' ? new BlobNotFoundError(key) : err;
    }
    const info = fstatSync(fd);
    if (!info.isFile()) {
      closeSync(fd);
      throw new BlobNotFoundError(key);
    }
    return { fd, size: info.size };
  }

  /**
   * Reads into one buffer that is reused for every piece: no allocation per read, which on a stream of
   * gigabytes is what drives V8's garbage collections (each 1 MiB buffer counts towards its limits).
   */
  async readFrames(key: string, first: number, size: number): Promise<AsyncIterableIterator<Frame>> {
    const file = this.openFile(key);
    // No bigger than the object (markers are a few bytes): an unused megabyte per read still costs a GC.
    const buf = Buffer.allocUnsafeSlow(Math.max(first, Math.min(size, file.size)));
    const small = file.size <= SMALL_BYTES;
    let reading: Promise<unknown> = Promise.resolve();
    const readInto = (at: number, length: number): number | Promise<number> => {
      if (small) return readSync(file.fd, buf, at, length, null);
      const done = readAsync(file.fd, buf, at, length, null).then((r) => r.bytesRead);
      reading = done.catch(() => undefined);
      return done;
    };
    let closing: Promise<void> | undefined;
    // The descriptor is closed only once no read is under way (its number could be reused meanwhile).
    const close = () => (closing ??= reading.then(() => closeSync(file.fd)));
    async function* frames(): AsyncGenerator<Frame> {
      try {
        // A buffer smaller than `size` holds the whole rest of the object, so its frame is the last.
        for (let want = first; ; want = Math.min(size, buf.length)) {
          let have = 0;
          while (have < want) {
            const bytesRead = await readInto(have, want - have);
            if (bytesRead === 0) break;
            have += bytesRead;
          }
          const last = have < want;
          yield { bytes: buf.subarray(0, have), last };
          if (last) return;
        }
      } finally {
        await close();
      }
    }
    const it = frames();
    // A generator's own return() skips its `finally` when it has not started: close explicitly.
    const reader: AsyncIterableIterator<Frame> = {
      next: () => it.next(),
      return: async () => {
        await close();
        return it.return(undefined);
      },
      [Symbol.asyncIterator]: () => reader,
    };
    return reader;
  }

  async stat(key: string): Promise<{ size: number } | null> {
    const path = this.pathOf(key);
    try {
      const info = statSync(path);
      return info.isFile() ? { size: info.size } : null;
    } catch (err) {
      if (isMissing(err)) return null;
      throw err;
    }
  }

  async delete(key: string): Promise<void> {
    const path = this.pathOf(key);
    try {
      unlinkSync(path);
    } catch (err) {
      // EISDIR: the key names a folder of other objects, not an object.
      if (!isMissing(err) && errorCode(err) !== 'EISDIR') throw err;
    }
  }

  async deletePrefix(prefix: string): Promise<number> {
    const dir = join(this.root, assertValidPrefix(prefix));
    // Detach the folder first: readers see everything vanish at once, and the count is exact even if
    // a put into the prefix is finishing concurrently (it lands in a fresh folder).
    const detached = this.tmpPath();
    try {
      renameSync(dir, detached);
    } catch (err) {
      if (isMissing(err)) return 0; // no folder (or a file where one would be): nothing under the prefix
      throw err;
    }
    return removeTree(detached, this.spares);
  }

  async sweepStale(olderThan: Date): Promise<number> {
    let removed = 0;
    // Spare files too: a store that stopped writing gives their disk back.
    for (const dir of [this.tmpDir, this.uploadTmpDir, this.spareDir]) {
      // A folder removed by hand holds nothing to sweep.
      const names = await readdir(dir).catch((err: unknown) => {
        if (isMissing(err)) return [];
        throw err;
      });
      for (const name of names) {
        const path = join(dir, name);
        const info = await lstat(path).catch(() => null);
        if (info && info.mtime < olderThan) {
          await rm(path, { recursive: true, force: true });
          removed += 1;
        }
      }
    }
    return removed;
  }

  async close(): Promise<void> {}

  private pathOf(key: string): string {
    assertValidKey(key);
    return join(this.root, key);
  }

  private tmpPath(): string {
    return join(this.tmpDir, randomUUID());
  }
}

const isMissing = (err: unknown) => errorCode(err) === 'ENOENT' || errorCode(err) === 'ENOTDIR';

function publish(from: string, dest: string): void {
  mkdirSync(dirname(dest), { recursive: true });
  renameSync(from, dest);
}

/**
 * Removes a folder that nothing writes into any more, in one walk; returns how many files it held.
 * Synchronous: a job's folder holds a few entries per file (MAX_FILES_PER_JOB of them at most).
 */
function removeTree(dir: string, spares: SpareFiles): number {
  let files = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) files += removeTree(path, spares);
    else {
      if (!spares.keep(path)) unlinkSync(path);
      files += 1;
    }
  }
  rmdirSync(dir);
  return files;
}

/** Files smaller than this are deleted, not kept: a pool of whole segments (lib/blob/followable.ts). */
const SPARE_MIN_BYTES = 1 << 20;
/** Off unless configured: deleted files are deleted, and the store holds no disk for later writes. */
export const DEFAULT_SPARE_BYTES = 0;

/**
 * Files of deleted objects, kept (up to a total size) for later writes to overwrite rather than create.
 * A new file's pages are new page-cache memory; a virtualised host that takes back the memory a guest
 * frees makes each page written after that a host fault, about ten times the cost of overwriting a file
 * whose pages are still cached (docs/performance.md, "Spare files"). Large objects are segments of job
 * files, sealed (lib/blob/sealed.ts): what a kept file still
 * holds is ciphertext, and a write that reuses it cuts it to its own length. PostgreSQL recycles its WAL
 * files for the same reason. Several processes share the folder: a file is taken by renaming it away
 * (only one rename wins), and the size limit may be overshot by a file per process that adds at once.
 * Each kept file's name starts with its size, so the total is one `readdir`.
 */
class SpareFiles {
  constructor(
    private readonly dir: string,
    private readonly maxBytes: number,
  ) {
    if (maxBytes > 0) mkdirSync(dir, { recursive: true });
  }

  /** Moves a spare file to `path` (for a new write to overwrite); false when there is none. Under a lowered limit too: that drains the folder. */
  takeInto(path: string): boolean {
    for (const name of this.names()) {
      try {
        renameSync(join(this.dir, name), path);
        return true;
      } catch (err) {
        if (!isMissing(err)) throw err; // another process took it first
      }
    }
    return false;
  }

  /** Keeps the file at `path` instead of deleting it, when it is large enough and there is room; false otherwise. */
  keep(path: string): boolean {
    if (this.maxBytes <= 0) return false;
    const { size } = statSync(path);
    if (size < SPARE_MIN_BYTES) return false;
    const held = this.names().reduce((n, name) => n + (Number.parseInt(name, 10) || 0), 0);
    if (held + size > this.maxBytes) return false;
    renameSync(path, join(this.dir, `${size}-${randomUUID()}`));
    return true;
  }

  /** The kept files' names; the folder is made again if it was removed by hand (unless nothing is to be kept). */
  private names(): string[] {
    try {
      return readdirSync(this.dir);
    } catch (err) {
      if (!isMissing(err)) throw err;
      if (this.maxBytes > 0) mkdirSync(this.dir, { recursive: true });
      return [];
    }
  }
}

/**
 * A put's temporary file. Up to SMALL_BYTES is held and written in one call at the end; past that the
 * file is opened and written as the data comes, each batch of chunks in one asynchronous writev.
 */
class FileSink extends Writable {
  private fd: number | undefined;
  private held: Buffer[] = [];
  private heldBytes = 0;
  /** Overwriting a spare file, which may be longer than what is written: cut at the end. */
  private reused = false;
  private written = 0;

  constructor(
    private readonly path: string,
    private readonly spares: SpareFiles,
  ) {
    super({ highWaterMark: STREAM_CHUNK_BYTES });
  }

  override _writev(chunks: { chunk: Buffer }[], callback: (err?: Error | null) => void): void {
    let bufs = chunks.map((c) => c.chunk);
    const bytes = bufs.reduce((n, b) => n + b.length, 0);
    this.written += bytes;
    if (this.fd === undefined) {
      for (const b of bufs) this.held.push(b);
      this.heldBytes += bytes;
      if (this.heldBytes <= SMALL_BYTES) return callback();
      try {
        this.reused = this.spares.takeInto(this.path);
        this.fd = openSync(this.path, this.reused ? 'r+' : 'wx');
      } catch (err) {
        return callback(err as Error);
      }
      bufs = this.held;
      this.held = [];
    }
    writeAll(this.fd, bufs, (err) => {
      // On the disk now: a single-use chunk's memory goes back at once (lib/single-use.ts).
      if (!err) for (const b of bufs) release(b);
      callback(err);
    });
  }

  override _final(callback: (err?: Error | null) => void): void {
    try {
      if (this.fd === undefined) writeFileSync(this.path, Buffer.concat(this.held, this.heldBytes), { flag: 'wx' });
      else {
        if (this.reused) ftruncateSync(this.fd, this.written);
        closeSync(this.fd);
      }
      this.fd = undefined;
      callback();
    } catch (err) {
      callback(err as Error);
    }
  }

  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    try {
      if (this.fd !== undefined) closeSync(this.fd);
    } catch (closeErr) {
      err ??= closeErr as Error;
    }
    this.fd = undefined;
    callback(err);
  }
}

/** writev until every byte is written (a write may be partial). */
function writeAll(fd: number, bufs: Buffer[], callback: (err?: Error | null) => void): void {
  writev(fd, bufs, (err, written) => {
    if (err) return callback(err);
    let i = 0;
    for (; i < bufs.length && written >= bufs[i].length; i++) written -= bufs[i].length;
    if (i === bufs.length) callback();
    else writeAll(fd, [bufs[i].subarray(written), ...bufs.slice(i + 1)], callback);
  });
}
