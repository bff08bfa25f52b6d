/**
 * One contract suite, run against the local driver (temp folder) and the S3 driver (a real s3rver on
 * 127.0.0.1). Objects of 20 MiB exceed the S3 part size, so multipart upload and abort are exercised.
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BlobNotFoundError, LocalBlobStore, createBlobStore, type BlobStore } from '../../lib/blob';
import { S3BlobStore } from '../../lib/blob/s3';
import { S3rver } from '../support/s3';

const MiB = 1 << 20;
const sha256 = (buf: Buffer) => createHash('sha256').update(buf).digest('hex');
const read = async (store: BlobStore, key: string) => buffer(await store.get(key));

/** Emits `bytes` of random data in 1 MiB chunks, then fails. */
function failingSource(bytes: number): Readable {
  let sent = 0;
  return new Readable({
    read() {
      if (sent >= bytes) return this.destroy(new Error('source broke'));
      const n = Math.min(MiB, bytes - sent);
      sent += n;
      this.push(randomBytes(n));
    },
  });
}

interface Harness {
  store: BlobStore;
  /** Temp files left by finished puts (local driver only). */
  leftovers?: () => Promise<string[]>;
  close(): Promise<void>;
}

async function localHarness(): Promise<Harness> {
  const dir = await mkdtemp(join(tmpdir(), 'blob-local-'));
  const store = await createBlobStore(join(dir, 'store'));
  return {
    store,
    leftovers: () => readdir(join(dir, 'store', '.tmp')),
    close: async () => {
      await store.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

async function s3Harness(): Promise<Harness> {
  const dir = await mkdtemp(join(tmpdir(), 'blob-s3-'));
  const server = new S3rver({
    address: '127.0.0.1',
    port: 0,
    silent: true,
    directory: join(dir, 's3rver'),
    configureBuckets: [{ name: 'kms-blobs' }],
  });
  const { port } = await server.run();
  const store = await createBlobStore('s3://kms-blobs/test-run', {
    s3: { endpoint: `http://127.0.0.1:${port}`, accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER', uploadTmpDir: join(dir, 'uploads') },
    env: {},
  });
  return {
    store,
    close: async () => {
      await store.close();
      await server.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

describe.each([
  ['local', localHarness],
  ['s3', s3Harness],
] as const)('%s blob store', (_name, setup) => {
  let h: Harness;
  let store: BlobStore;
  beforeAll(async () => {
    h = await setup();
    store = h.store;
  });
  afterAll(() => h?.close());

  it('round-trips a multi-MiB object and reports size and progress', async () => {
    const data = randomBytes(20 * MiB + 123);
    const progress: number[] = [];
    const { size } = await store.put('jobs/j1/out/0', Readable.from(chunks(data, MiB)), { onProgress: (n) => progress.push(n) });

    expect(size).toBe(data.length);
    expect(progress.at(-1)).toBe(data.length);
    expect(progress).toEqual([...progress].sort((a, b) => a - b));
    expect(await store.stat('jobs/j1/out/0')).toEqual({ size: data.length });
    expect(sha256(await read(store, 'jobs/j1/out/0'))).toBe(sha256(data));
  });

  it('reads a byte range', async () => {
    const data = randomBytes(64 * 1024);
    await store.put('ranged', Readable.from([data]));
    expect(await buffer(await store.get('ranged', { start: 10, end: 4095 }))).toEqual(data.subarray(10, 4096));
    expect(await buffer(await store.get('ranged', { start: 60_000 }))).toEqual(data.subarray(60_000));
    await expect(store.get('ranged', { start: 5, end: 4 })).rejects.toThrow(RangeError);
  });

  it('stores an empty object', async () => {
    expect(await store.put('empty', Readable.from([]))).toEqual({ size: 0 });
    expect(await store.stat('empty')).toEqual({ size: 0 });
    expect((await read(store, 'empty')).length).toBe(0);
  });

  it('overwrites an existing object', async () => {
    await store.put('over', Readable.from([Buffer.from('first version')]));
    await store.put('over', Readable.from([Buffer.from('second')]));
    expect((await read(store, 'over')).toString()).toBe('second');
    expect(await store.stat('over')).toEqual({ size: 6 });
  });

  it('leaves nothing behind when the source fails midway', async () => {
    await expect(store.put('jobs/j2/out/0', failingSource(10 * MiB))).rejects.toThrow('source broke');
    expect(await store.stat('jobs/j2/out/0')).toBeNull();
    await expect(store.get('jobs/j2/out/0')).rejects.toBeInstanceOf(BlobNotFoundError);
    if (h.leftovers) expect(await h.leftovers()).toEqual([]);
  });

  it('keeps the previous object when an overwrite fails', async () => {
    await store.put('keep', Readable.from([Buffer.from('intact')]));
    await expect(store.put('keep', failingSource(3 * MiB))).rejects.toThrow('source broke');
    expect((await read(store, 'keep')).toString()).toBe('intact');
  });

  it('stops and cleans up when the signal aborts', async () => {
    const ac = new AbortController();
    const endless = new Readable({ read() { this.push(randomBytes(MiB)); } });
    const put = store.put('aborted', endless, { signal: ac.signal, onProgress: (n) => n >= 10 * MiB && ac.abort() });
    await expect(put).rejects.toMatchObject({ name: 'AbortError' });
    expect(await store.stat('aborted')).toBeNull();
    if (h.leftovers) expect(await h.leftovers()).toEqual([]);
  });

  it('moves a local file in with putFile', async () => {
    const data = randomBytes(3 * MiB);
    const path = join(store.uploadTmpDir, 'upload-1');
    await writeFile(path, data);
    expect(await store.putFile('uploads/u1', path)).toEqual({ size: data.length });
    expect(existsSync(path)).toBe(false);
    expect(sha256(await read(store, 'uploads/u1'))).toBe(sha256(data));
  });

  it('rejects a missing object with BlobNotFoundError', async () => {
    await expect(store.get('no/such/object')).rejects.toBeInstanceOf(BlobNotFoundError);
    await expect(store.get('no/such/object')).rejects.toMatchObject({ key: 'no/such/object' });
    expect(await store.stat('no/such/object')).toBeNull();
  });

  it('deletes idempotently', async () => {
    await store.put('doomed', Readable.from([Buffer.from('x')]));
    await store.delete('doomed');
    expect(await store.stat('doomed')).toBeNull();
    await expect(store.delete('doomed')).resolves.toBeUndefined();
    await expect(store.delete('never/existed')).resolves.toBeUndefined();
  });

  it('deletes everything under a prefix, and only that', async () => {
    for (const key of ['jobs/p1/in', 'jobs/p1/out/0', 'jobs/p1/out/1', 'jobs/p10/in', 'jobs/p1.txt']) {
      await store.put(key, Readable.from([Buffer.from(key)]));
    }
    expect(await store.deletePrefix('jobs/p1/')).toBe(3);
    expect(await store.stat('jobs/p1/out/0')).toBeNull();
    expect(await store.stat('jobs/p10/in')).toEqual({ size: 'jobs/p10/in'.length });
    expect(await store.stat('jobs/p1.txt')).not.toBeNull();
    expect(await store.deletePrefix('jobs/p1/')).toBe(0);
    await expect(store.deletePrefix('jobs/p1')).rejects.toThrow(TypeError);
    await expect(store.deletePrefix('')).rejects.toThrow(TypeError);
    await expect(store.deletePrefix('/')).rejects.toThrow(TypeError);
  });

  it.each(['', '/etc/passwd', '../x', 'a/../../b', 'a/./b', 'a//b', 'a/', '.tmp/x', 'a\0b', 'a b', 'a\\b', 'é', 'x'.repeat(600)])(
    'rejects the bad key %j',
    async (key) => {
      await expect(store.put(key, Readable.from([Buffer.from('x')]))).rejects.toThrow(TypeError);
      await expect(store.get(key)).rejects.toThrow(TypeError);
      await expect(store.stat(key)).rejects.toThrow(TypeError);
      await expect(store.delete(key)).rejects.toThrow(TypeError);
    },
  );
});

describe('createBlobStore', () => {
  it('opens folders from paths and file URLs, S3 from s3:// URLs', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'blob-factory-'));
    try {
      const fromPath = await createBlobStore(join(dir, 'a'));
      const fromUrl = await createBlobStore(pathToFileURL(join(dir, 'b')).href);
      expect(fromPath).toBeInstanceOf(LocalBlobStore);
      expect((fromUrl as LocalBlobStore).root).toBe(join(dir, 'b'));
      expect(fromUrl.uploadTmpDir.startsWith(join(dir, 'b'))).toBe(true);

      const s3 = await createBlobStore('s3://some-bucket/some/prefix', { env: { S3_ENDPOINT: 'http://127.0.0.1:1' }, s3: { uploadTmpDir: join(dir, 'up') } });
      expect(s3).toBeInstanceOf(S3BlobStore);
      expect((s3 as S3BlobStore).bucket).toBe('some-bucket');
      await s3.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('refuses unknown schemes', async () => {
    await expect(createBlobStore('http://example.com/blobs')).rejects.toThrow(/unsupported/);
    await expect(createBlobStore('s3:///prefix')).rejects.toThrow();
  });
});

function* chunks(buf: Buffer, size: number): Generator<Buffer> {
  for (let i = 0; i < buf.length; i += size) yield buf.subarray(i, i + size);
}
