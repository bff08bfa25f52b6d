/**
 * Blob store in a local folder. Layout under the root:
 *   <key>        published objects
 *   .tmp/        in-progress writes, renamed into place once complete (same filesystem: atomic)
 *   .uploads/    `uploadTmpDir`, where upload parsers write before `putFile` renames
 * Keys never start a segment with a dot, so these names cannot collide with objects.
 */
import { randomUUID } from 'node:crypto';
import { createReadStream, createWriteStream, mkdirSync } from 'node:fs';
import { lstat, mkdir, open, readdir, rename, rm, rmdir, stat, unlink } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
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

export class LocalBlobStore implements BlobStore {
  readonly root: string;
  readonly uploadTmpDir: string;
  private readonly tmpDir: string;

  /** Creates the root and its working folders synchronously: this runs once at startup. */
  constructor(root: string) {
    this.root = resolve(root);
    this.tmpDir = join(this.root, '.tmp');
    this.uploadTmpDir = join(this.root, '.uploads');
    mkdirSync(this.tmpDir, { recursive: true });
    mkdirSync(this.uploadTmpDir, { recursive: true });
  }

  async put(key: string, source: Readable, opts: PutOptions = {}): Promise<{ size: number }> {
    const dest = this.pathOf(key);
    const tmp = this.tmpPath();
    const counter = byteCounter(opts.onProgress);
    try {
      await pipeline(
        source,
        counter.stage,
        createWriteStream(tmp, { flags: 'wx', highWaterMark: STREAM_CHUNK_BYTES }),
        { signal: opts.signal },
      );
      await this.publish(tmp, dest);
    } catch (err) {
      await rm(tmp, { force: true });
      throw err;
    }
    return { size: counter.bytes };
  }

  async putFile(key: string, path: string): Promise<{ size: number }> {
    const dest = this.pathOf(key);
    const info = await stat(path);
    if (!info.isFile()) throw new TypeError(`not a regular file: ${path}`);
    try {
      await this.publish(path, dest);
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
    const handle = await this.openFile(key);
    return handle.createReadStream({ start: range?.start, end: range?.end, highWaterMark: STREAM_CHUNK_BYTES });
  }

  /** Opens an object for reading: a missing object rejects here rather than as a stream error later. */
  private async openFile(key: string) {
    const path = this.pathOf(key);
    const handle = await open(path, 'r').catch((err: unknown) => {
      throw errorCode(err) === 'ENOENT' || errorCode(err) === 'ENOTDIR' ? new BlobNotFoundError(key) : err;
    });
    const info = await handle.stat();
    if (!info.isFile()) {
      await handle.close();
      throw new BlobNotFoundError(key);
    }
    return Object.assign(handle, { size: info.size });
  }

  /**
   * Reads into one buffer that is reused for every piece: no allocation per read, which on a stream of
   * gigabytes is what drives V8's garbage collections (each 1 MiB buffer counts towards its limits).
   */
  async readFrames(key: string, first: number, size: number): Promise<AsyncIterableIterator<Frame>> {
    const handle = await this.openFile(key);
    // No bigger than the object (markers are a few bytes): an unused megabyte per read still costs a GC.
    const buf = Buffer.allocUnsafeSlow(Math.max(first, Math.min(size, handle.size)));
    let closing: Promise<void> | undefined;
    const close = () => (closing ??= handle.close()); // waits for a read in flight
    async function* frames(): AsyncGenerator<Frame> {
      try {
        // A buffer smaller than `size` holds the whole rest of the object, so its frame is the last.
        for (let want = first; ; want = Math.min(size, buf.length)) {
          let have = 0;
          while (have < want) {
            const { bytesRead } = await handle.read(buf, have, want - have, null);
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
      const info = await stat(path);
      return info.isFile() ? { size: info.size } : null;
    } catch (err) {
      if (isMissing(err)) return null;
      throw err;
    }
  }

  async delete(key: string): Promise<void> {
    const path = this.pathOf(key);
    try {
      await unlink(path);
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
      await rename(dir, detached);
    } catch (err) {
      if (isMissing(err)) return 0; // no folder (or a file where one would be): nothing under the prefix
      throw err;
    }
    return removeTree(detached);
  }

  async sweepStale(olderThan: Date): Promise<number> {
    let removed = 0;
    for (const dir of [this.tmpDir, this.uploadTmpDir]) {
      // A folder removed by hand holds nothing to sweep.
      const names = await readdir(dir).catch((err: unknown) => (isMissing(err) ? [] : Promise.reject(err)));
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

  private async publish(from: string, dest: string): Promise<void> {
    await mkdir(dirname(dest), { recursive: true });
    await rename(from, dest);
  }
}

const isMissing = (err: unknown) => errorCode(err) === 'ENOENT' || errorCode(err) === 'ENOTDIR';

/** Removes a folder that nothing writes into any more, in one walk; returns how many files it held. */
async function removeTree(dir: string): Promise<number> {
  let files = 0;
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) files += await removeTree(path);
    else {
      await unlink(path);
      files += 1;
    }
  }
  await rmdir(dir);
  return files;
}
