import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { BlobNotFoundError, LocalBlobStore } from '../../lib/blob';
import { sealedJobBlobs } from '../../lib/blob/sealed';
import { jobKeyRows } from '../support/job-keys';
import { createSealer } from '../../lib/sealer';

/**
 * LocalBlobStore.readFrames, the reused-buffer read that sealed blobs are opened through: exact piece
 * sizes, the end marked once, and the file released however the reader stops.
 */
let dir: string;
let store: LocalBlobStore;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kms-frames-'));
  store = new LocalBlobStore(dir);
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const openFiles = () => readdirSync('/proc/self/fd').length;

/** Every piece, copied (the reader reuses its buffer), with its `last` flag. */
async function pieces(key: string, first: number, size: number): Promise<{ bytes: Buffer; last: boolean }[]> {
  const out: { bytes: Buffer; last: boolean }[] = [];
  for await (const f of await store.readFrames(key, first, size)) out.push({ bytes: Buffer.from(f.bytes), last: f.last });
  return out;
}

describe('LocalBlobStore.readFrames', () => {
  it('cuts the object into the first piece, whole pieces and the remainder, the last one marked', async () => {
    const data = randomBytes(30);
    await writeFile(join(dir, 'thirty'), data);
    const got = await pieces('thirty', 5, 8);
    expect(got.map((p) => [p.bytes.length, p.last])).toEqual([
      [5, false],
      [8, false],
      [8, false],
      [8, false],
      [1, true],
    ]);
    expect(Buffer.concat(got.map((p) => p.bytes))).toEqual(data);

    // Whole pieces to the end: an empty remainder still comes, marked last.
    await writeFile(join(dir, 'exact'), data.subarray(0, 21));
    expect((await pieces('exact', 5, 8)).map((p) => [p.bytes.length, p.last])).toEqual([
      [5, false],
      [8, false],
      [8, false],
      [0, true],
    ]);
    // Shorter than the first piece, and empty.
    await writeFile(join(dir, 'short'), data.subarray(0, 3));
    expect((await pieces('short', 5, 8)).map((p) => [p.bytes.length, p.last])).toEqual([[3, true]]);
    await writeFile(join(dir, 'empty'), Buffer.alloc(0));
    expect((await pieces('empty', 5, 8)).map((p) => [p.bytes.length, p.last])).toEqual([[0, true]]);
  });

  it('refuses a missing object like get', async () => {
    await expect(store.readFrames('nothing/here', 5, 8)).rejects.toBeInstanceOf(BlobNotFoundError);
  });

  it('releases the file when the reader stops early or never starts', async () => {
    await writeFile(join(dir, 'big'), randomBytes(64 * 1024));
    const before = openFiles();
    const unstarted = await store.readFrames('big', 16, 1024);
    expect(openFiles()).toBe(before + 1);
    await unstarted.return!(undefined);
    expect(openFiles()).toBe(before);

    const started = await store.readFrames('big', 16, 1024);
    await started.next();
    await started.next();
    await started.return!(undefined);
    expect(openFiles()).toBe(before);

    for await (const f of await store.readFrames('big', 16, 1024)) if (!f.last) break;
    expect(openFiles()).toBe(before);
  });

  it('lets a sealed blob be read back whole, and released when its reader is destroyed midway', async () => {
    const jobs = jobKeyRows(createSealer(`t1:${randomBytes(32).toString('base64')}`));
    const sealed = sealedJobBlobs(store, jobs.keys());
    const key = `jobs/${jobs.newJob()}/in/0`;
    const data = randomBytes(3 * (1 << 20) + 5);
    await sealed.put(key, Readable.from([data]));
    const chunks: Buffer[] = [];
    for await (const c of await sealed.get(key)) chunks.push(c as Buffer);
    expect(Buffer.concat(chunks).equals(data)).toBe(true); // toEqual on MiBs of bytes takes seconds

    const before = openFiles();
    const reader = await sealed.get(key);
    await new Promise<void>((resolve) => reader.once('data', () => resolve()));
    reader.destroy();
    for (let i = 0; i < 50 && openFiles() > before; i++) await sleep(10);
    expect(openFiles()).toBe(before);
  });
});
