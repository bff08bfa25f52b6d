import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createBlobStore, type BlobStore } from '../../lib/blob';
import { followableJobFiles, type JobBlobStore } from '../../lib/blob/followable';
import { sealedJobBlobs } from '../../lib/blob/sealed';
import { createSealer } from '../../lib/sealer';
import { startS3 } from '../support/s3';
import { jobKeyRows } from '../support/job-keys';

const SEGMENT = 64 * 1024;
const jobs = jobKeyRows(createSealer(`t1:${Buffer.alloc(32, 7).toString('base64')}`));
const key = (n = 0, dir: 'in' | 'out' = 'in') => `jobs/${jobs.newJob()}/${dir}/${n}`;
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
async function collect(stream: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of stream) parts.push(c as Buffer);
  return Buffer.concat(parts);
}

/** Two stacks on one folder or bucket: the writer's process and a reader's. */
describe.each(['local', 's3'] as const)('followable job files (%s)', (backend) => {
  let root: string;
  let writer: JobBlobStore;
  let reader: JobBlobStore;
  let close = async () => {};

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'followable-'));
    let open: () => Promise<BlobStore> = () => createBlobStore(join(root, 'store'));
    if (backend === 's3') {
      const s3 = await startS3(root);
      close = s3.close;
      open = () =>
        createBlobStore('s3://kms-blobs/followable', {
          s3: { endpoint: s3.endpoint, accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER', uploadTmpDir: join(root, 'uploads') },
          env: {},
        });
    }
    const stack = async () => followableJobFiles(sealedJobBlobs(await open(), jobs.keys()), { segmentBytes: SEGMENT });
    writer = await stack();
    reader = await stack();
  });
  afterAll(async () => {
    await Promise.all([writer?.close(), reader?.close()]);
    await close();
    rmSync(root, { recursive: true, force: true });
  });

  it.each([0, 1, SEGMENT - 1, SEGMENT, SEGMENT + 1, 3 * SEGMENT, 3 * SEGMENT + 17])('round-trips %i bytes with get, stat and follow', async (size) => {
    const k = key();
    const data = randomBytes(size);
    expect(await writer.put(k, Readable.from([data.subarray(0, size >> 1), data.subarray(size >> 1)]))).toEqual({ size });
    expect(await reader.stat(k)).toEqual({ size });
    expect(sha(await collect(await reader.get(k)))).toBe(sha(data));
    expect(sha(await collect(await reader.follow(k)))).toBe(sha(data));
  });

  it('a follower reads a file while another store instance writes it, and ends only at its end', async () => {
    const k = key(2);
    const data = randomBytes(5 * SEGMENT + 123);
    const source = new PassThrough();
    const put = writer.put(k, source);
    const following = reader.follow(k, { idleMs: 5000 }).then(collect);
    let read = 0;
    for (let off = 0; off < data.length; off += 10_000) {
      source.write(data.subarray(off, off + 10_000));
      read += 1;
      if (read % 10 === 0) await new Promise((r) => setTimeout(r, 5));
    }
    // Before the end: absent for get and stat, as any put in progress.
    expect(await reader.stat(k)).toBeNull();
    await expect(reader.get(k)).rejects.toThrow(/not found/);
    source.end();
    await put;
    expect(sha(await following)).toBe(sha(data));
  });

  it('a failed write makes its followers fail at once and leaves nothing readable', async () => {
    const k = key();
    const source = new PassThrough();
    const put = writer.put(k, source);
    source.write(randomBytes(2 * SEGMENT + 5));
    const following = reader.follow(k, { idleMs: 30_000 }).then(collect);
    following.catch(() => undefined); // it may fail while the put's failure is awaited: not unhandled
    await new Promise((r) => setTimeout(r, 50));
    source.destroy(new Error('client went away'));
    await expect(put).rejects.toThrow(/client went away/);
    const started = Date.now();
    await expect(following).rejects.toThrow(/writer failed/);
    expect(Date.now() - started).toBeLessThan(5000);
    expect(await reader.stat(k)).toBeNull();
  });

  it('a follower stops on abort and after idleMs without news', async () => {
    const k = key();
    const source = new PassThrough();
    const put = writer.put(k, source).catch(() => undefined);
    source.write(randomBytes(10));
    await expect(reader.follow(k, { idleMs: 300 }).then(collect)).rejects.toThrow(/nothing new/);
    const ac = new AbortController();
    const f = reader.follow(k, { signal: ac.signal, idleMs: 30_000 }).then(collect);
    setTimeout(() => ac.abort(new Error('stop')), 50);
    await expect(f).rejects.toThrow();
    source.destroy(new Error('done'));
    await put;
  });

  it('a follower told that the write has begun fails at once when the file is gone (its job failed), not after startMs', async () => {
    const k = key();
    await writer.put(k, Readable.from([randomBytes(10)]));
    await writer.deletePrefix(k.slice(0, k.indexOf('/in/') + 1));
    const started = Date.now();
    await expect(reader.follow(k, { idleMs: 30_000, begun: true }).then(collect)).rejects.toThrow(/is gone/);
    expect(Date.now() - started).toBeLessThan(5000);
  });

  it('a follower waits startMs for a write to begin, then idleMs between its segments', async () => {
    const k = key();
    await expect(reader.follow(k, { idleMs: 200 }).then(collect)).rejects.toThrow(/nothing new for 200 ms \(not started\)/);
    const data = randomBytes(3 * SEGMENT);
    const followed = reader.follow(k, { idleMs: 200, startMs: 5000 }).then(collect);
    await new Promise((r) => setTimeout(r, 600));
    const source = new PassThrough();
    const put = writer.put(k, source);
    source.write(data.subarray(0, SEGMENT + 1));
    await new Promise((r) => setTimeout(r, 100));
    source.end(data.subarray(SEGMENT + 1));
    await put;
    expect(sha(await followed)).toBe(sha(data));
  });

  it('a rewrite never splices into a reader of the previous write', async () => {
    const k = key();
    // Larger than the reader's read-ahead (1 MiB), so that most of it is read after the rewrite.
    await writer.put(k, Readable.from([randomBytes(40 * SEGMENT)]));
    const old = (await reader.get(k))[Symbol.asyncIterator]();
    expect((await old.next()).done).toBe(false);
    const fresh = randomBytes(40 * SEGMENT);
    await writer.put(k, Readable.from([fresh]));
    const rest = async () => {
      while (!(await old.next()).done);
    };
    await expect(rest()).rejects.toThrow(/missing|rewritten/);
    expect(sha(await collect(await reader.get(k)))).toBe(sha(fresh));
  });

  it('a small file is stored whole in its end marker: one object, followed, replaced and deleted like any other', async () => {
    const k = key();
    const early = reader.follow(k, { idleMs: 5000 }).then(collect); // a follower that starts before the writer
    const small = randomBytes(1000);
    let openedWith: number | null | undefined;
    await writer.put(k, Readable.from([small]), { fresh: true, onOpen: async () => void (openedWith = (await reader.stat(k))?.size ?? null) });
    expect(openedWith).toBe(1000); // told once whole, never before
    expect(sha(await early)).toBe(sha(small));
    expect(sha(await collect(await reader.get(k)))).toBe(sha(small));
    // Replaced by a large write and back: each reads as itself, and the file goes with delete.
    const large = randomBytes(2 * SEGMENT + 3);
    await writer.put(k, Readable.from([large]));
    expect(sha(await collect(await reader.get(k)))).toBe(sha(large));
    const again = randomBytes(7);
    await writer.put(k, Readable.from([again]));
    expect(sha(await collect(await reader.follow(k)))).toBe(sha(again));
    await writer.delete(k);
    expect(await reader.stat(k)).toBeNull();
  });

  it('a small file whose announcement fails is not left behind', async () => {
    const k = key();
    await expect(
      writer.put(k, Readable.from([randomBytes(10)]), { fresh: true, onOpen: () => Promise.reject(new Error('job failed meanwhile')) }),
    ).rejects.toThrow(/job failed meanwhile/);
    expect(await reader.stat(k)).toBeNull();
  });

  it('a small file that trickles in is followed as it arrives, not held back until it ends', async () => {
    const k = key();
    const source = new PassThrough();
    const put = writer.put(k, source);
    source.write(Buffer.from('first'));
    const it = (await reader.follow(k, { idleMs: 5000 }))[Symbol.asyncIterator]();
    expect(((await it.next()).value as Buffer).toString()).toBe('first');
    source.end(Buffer.from('-second'));
    await put;
    expect(((await it.next()).value as Buffer).toString()).toBe('-second');
    expect((await it.next()).done).toBe(true);
  });

  it.runIf(backend === 'local')("a fresh put (a new job's file) only writes: it looks for no earlier write to replace", async () => {
    const calls: string[] = [];
    const sealed = sealedJobBlobs(await createBlobStore(join(root, 'store')), jobs.keys());
    const spied = new Proxy(sealed, {
      get: (target, name: keyof BlobStore) =>
        typeof target[name] === 'function'
          ? (...args: unknown[]) => (calls.push(String(name)), (target[name] as (...a: unknown[]) => unknown)(...args))
          : Reflect.get(target, name),
    });
    const store = followableJobFiles(spied, { segmentBytes: SEGMENT });
    const k = key();
    const data = randomBytes(2 * SEGMENT + 5);
    await store.put(k, Readable.from([data]), { fresh: true });
    expect(calls).toEqual(['put', 'put', 'put', 'put', 'put']); // head, three segments, end marker
    expect(sha(await collect(await reader.get(k)))).toBe(sha(data));
  });

  it.runIf(backend === 'local')('a small file is one object, and replacing a large one leaves no head or segment of it', async () => {
    const k = key();
    const dir = k.split('/').slice(0, 2).join('/');
    const files = () =>
      readdirSync(join(root, 'store', dir), { recursive: true, withFileTypes: true })
        .filter((e) => e.isFile())
        .map((e) => e.name)
        .sort();
    await writer.put(k, Readable.from([randomBytes(100)]), { fresh: true });
    expect(files()).toEqual(['0']);
    await writer.put(k, Readable.from([randomBytes(3 * SEGMENT)]));
    await writer.put(k, Readable.from([randomBytes(100)]));
    expect(files()).toEqual(['0']);
  });

  it.runIf(backend === 'local')('an inline end marker has no segment count, and its bytes must match its size', async () => {
    const sealed = sealedJobBlobs(await createBlobStore(join(root, 'store')), jobs.keys());
    const k = key();
    await writer.put(k, Readable.from([Buffer.from('abc')]), { fresh: true });
    // No `segments`: a reader that predates inline files fails on it instead of reading an empty file.
    expect(JSON.parse((await collect(await sealed.get(k))).toString())).toEqual({ write: expect.stringMatching(/^[0-9a-f]{32}$/), size: 3, data: 'YWJj' });
    const marker = (m: object) => sealed.put(k, Readable.from([Buffer.from(JSON.stringify({ write: 'ab'.repeat(16), ...m }))]));
    for (const bad of [
      { size: 4, data: 'YWJj' },
      { segments: 0, size: 3, data: 'YWJj' },
      { size: 3, data: 'YWJj!' },
    ]) {
      await marker(bad);
      await expect(reader.get(k).then(collect), JSON.stringify(bad)).rejects.toThrow(/malformed end marker/);
    }
    await marker({ size: 3, data: 'YWJj' });
    expect((await reader.get(k).then(collect)).toString()).toBe('abc');
  });

  it.runIf(backend === 'local')('deleting the file or its folder removes every segment', async () => {
    const k = key();
    const dir = k.split('/').slice(0, 2).join('/');
    const files = () =>
      readdirSync(join(root, 'store', dir), { recursive: true, withFileTypes: true })
        .filter((e) => e.isFile())
        .map((e) => e.name);
    await writer.put(k, Readable.from([randomBytes(3 * SEGMENT)]));
    await writer.put(k, Readable.from([randomBytes(2 * SEGMENT)])); // the first write's segments go too
    // The second write's two segments beside the file (no folders), its head and end marker.
    const write = files()
      .find((f) => f.endsWith('.0') && f !== '0')!
      .slice(2, -2);
    expect(files().sort()).toEqual(['0', `0.${write}.0`, `0.${write}.1`, '0.head']);
    await writer.delete(k);
    expect(await reader.stat(k)).toBeNull();
    expect(files()).toEqual([]);
    await writer.put(k, Readable.from([randomBytes(3 * SEGMENT)]));
    await writer.deletePrefix(`${dir}/`);
    await expect(reader.get(k)).rejects.toThrow(/not found/);
  });

  it.runIf(backend === 'local')('the segments of a writer that crashed go with the next write, or with the file', async () => {
    const dir = key().replace(/\/0$/, '');
    const files = (n: number) =>
      readdirSync(join(root, 'store', dir))
        .filter((f) => f.split('.')[0] === String(n))
        .sort();
    const sealed = sealedJobBlobs(await createBlobStore(join(root, 'store')), jobs.keys());
    await writer.put(`${dir}/9`, Readable.from([randomBytes(5)]), { fresh: true }); // the job's folder
    /** What a writer leaves when its process dies: its head and segments, no end marker. */
    const crashed = async (k: string) => {
      const w = randomBytes(16).toString('hex');
      for (const [name, text] of [
        [`${k}.head`, w],
        [`${k}.${w}.0`, 'a'],
        [`${k}.${w}.1`, 'b'],
      ])
        await sealed.put(name, Readable.from([Buffer.from(text)]));
    };
    await crashed(`${dir}/0`);
    await writer.put(`${dir}/0`, Readable.from([randomBytes(SEGMENT + 1)]));
    const write = files(0)
      .find((f) => f.endsWith('.1'))!
      .slice(2, -2);
    expect(files(0)).toEqual(['0', `0.${write}.0`, `0.${write}.1`, '0.head']);
    await crashed(`${dir}/1`);
    await writer.delete(`${dir}/1`);
    expect(files(1)).toEqual([]);
  });
});
