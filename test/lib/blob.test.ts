/**
 * One contract suite, run against the local driver (temp folder) and the S3 driver (a real s3rver on
 * 127.0.0.1). Objects of 20 MiB exceed the S3 part size, so multipart upload and abort are exercised.
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, readdir, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { createServer, type RequestListener } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BlobNotFoundError, LocalBlobStore, createBlobStore, type BlobStore } from '../../lib/blob';
import { SMALL_BYTES } from '../../lib/blob/local';
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
  /** The driver's own temp folder for puts in progress (local driver only). */
  tmpDir?: string;
  close(): Promise<void>;
}

async function localHarness(): Promise<Harness> {
  const dir = await mkdtemp(join(tmpdir(), 'blob-local-'));
  const store = await createBlobStore(join(dir, 'store'));
  return {
    store,
    leftovers: () => readdir(join(dir, 'store', '.tmp')),
    tmpDir: join(dir, 'store', '.tmp'),
    close: async () => {
      await store.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

async function s3Harness(url = 's3://kms-blobs/test-run'): Promise<Harness> {
  const dir = await mkdtemp(join(tmpdir(), 'blob-s3-'));
  const server = new S3rver({
    address: '127.0.0.1',
    port: 0,
    silent: true,
    directory: join(dir, 's3rver'),
    configureBuckets: [{ name: 'kms-blobs' }],
  });
  const { port } = await server.run();
  const store = await createBlobStore(url, {
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

  // The local driver writes and reads objects up to SMALL_BYTES in one call, larger ones as streams.
  it.each([SMALL_BYTES - 1, SMALL_BYTES, SMALL_BYTES + 1, 3 * SMALL_BYTES + 7])('round-trips %i bytes sent in odd pieces, whole and by range', async (n) => {
    const data = randomBytes(n);
    const key = `sized/${n}`;
    expect(await store.put(key, Readable.from(chunks(data, 40_000)))).toEqual({ size: n });
    expect(await store.stat(key)).toEqual({ size: n });
    expect(sha256(await read(store, key))).toBe(sha256(data));
    expect(await buffer(await store.get(key, { start: n - 10 }))).toEqual(data.subarray(n - 10));
    expect(await buffer(await store.get(key, { start: 3, end: 40_002 }))).toEqual(data.subarray(3, 40_003));
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

  // Within the first part (S3: before any request) and past it (S3: inside a multipart upload).
  it.each([3, 10])('stops and cleans up when the signal aborts after %i MiB', async (mib) => {
    const ac = new AbortController();
    const endless = new Readable({
      read() {
        this.push(randomBytes(MiB));
      },
    });
    const put = store.put('aborted', endless, { signal: ac.signal, onProgress: (n) => n >= mib * MiB && ac.abort() });
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

  it('sweeps temporary files older than the cut-off and keeps fresh ones', async () => {
    const past = new Date(Date.now() - 48 * 3600_000);
    const dirs = [store.uploadTmpDir, ...(h.tmpDir ? [h.tmpDir] : [])];
    for (const d of dirs) {
      await writeFile(join(d, 'stale-leftover'), 'left by a crash');
      await utimes(join(d, 'stale-leftover'), past, past);
      await writeFile(join(d, 'fresh-upload'), 'still arriving');
    }
    expect(await store.sweepStale(new Date(Date.now() - 24 * 3600_000))).toBe(dirs.length);
    for (const d of dirs) {
      expect(await readdir(d)).toEqual(['fresh-upload']);
      await rm(join(d, 'fresh-upload'));
    }
    expect(await store.sweepStale(new Date())).toBe(0);
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

describe('LocalBlobStore spare files', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'blob-spare-'));
  });
  afterAll(() => rm(dir, { recursive: true, force: true }));

  const spares = (root: string) => readdir(join(root, '.spare')).catch(() => []);
  /** Puts `size` random bytes under `key`, in 256 KiB pieces, and returns them. */
  async function putRandom(store: BlobStore, key: string, size: number): Promise<Buffer> {
    const data = randomBytes(size);
    const pieces = Array.from({ length: Math.ceil(size / (256 << 10)) }, (_, i) => data.subarray(i * (256 << 10), (i + 1) * (256 << 10)));
    await store.put(key, Readable.from(pieces));
    return data;
  }

  it('keeps the files of a deleted prefix up to the limit, and a later put overwrites one: bytes exact, shorter or longer', async () => {
    const root = join(dir, 'reuse');
    const store = new LocalBlobStore(root, { spareBytes: 5 * MiB });
    for (const n of [0, 1, 2]) await putRandom(store, `jobs/a/in/${n}`, 2 * MiB);
    await putRandom(store, 'jobs/a/in/small', MiB - 1); // under the spare minimum: deleted
    expect(await store.deletePrefix('jobs/a/')).toBe(4);
    // Two of the three 2 MiB files fit under 5 MiB.
    const kept = await spares(root);
    expect(kept).toHaveLength(2);
    const inodes = new Set(await Promise.all(kept.map(async (name) => (await stat(join(root, '.spare', name))).ino)));

    const shorter = await putRandom(store, 'jobs/b/out/0', MiB + 12345);
    const longer = await putRandom(store, 'jobs/b/out/1', 3 * MiB + 1);
    expect(await spares(root)).toEqual([]);
    expect(inodes.has((await stat(join(root, 'jobs/b/out/0'))).ino)).toBe(true);
    expect(inodes.has((await stat(join(root, 'jobs/b/out/1'))).ino)).toBe(true);
    expect(sha256(await read(store, 'jobs/b/out/0'))).toBe(sha256(shorter));
    expect(await store.stat('jobs/b/out/0')).toEqual({ size: shorter.length });
    expect(sha256(await read(store, 'jobs/b/out/1'))).toBe(sha256(longer));
    // No spare left: a new file (the spares' inodes are in use, so it cannot have one of them).
    const fresh = await putRandom(store, 'jobs/b/out/2', 2 * MiB);
    expect(inodes.has((await stat(join(root, 'jobs/b/out/2'))).ino)).toBe(false);
    expect(sha256(await read(store, 'jobs/b/out/2'))).toBe(sha256(fresh));
  });

  /** A store in a folder of its own holding one spare file: a 2 MiB file put, then its job's folder deleted. */
  async function withOneSpare(name: string): Promise<{ root: string; store: LocalBlobStore }> {
    const root = join(dir, name);
    const store = new LocalBlobStore(root, { spareBytes: 8 * MiB });
    await putRandom(store, 'jobs/s/in/0', 2 * MiB);
    await store.deletePrefix('jobs/s/');
    expect(await spares(root)).toHaveLength(1);
    return { root, store };
  }

  it('a failed put that took a spare file leaves neither the file nor a temp behind', async () => {
    const { root, store } = await withOneSpare('failed');
    await expect(store.put('jobs/c/out/0', failingSource(3 * MiB))).rejects.toThrow('source broke');
    expect(await spares(root)).toEqual([]);
    expect(await readdir(join(root, '.tmp'))).toEqual([]);
    expect(await store.stat('jobs/c/out/0')).toBeNull();
  });

  it('with no room for spares (0), deletes the files and makes no spare folder', async () => {
    const root = join(dir, 'off');
    const store = new LocalBlobStore(root, { spareBytes: 0 });
    await putRandom(store, 'jobs/d/in/0', 2 * MiB);
    expect(await store.deletePrefix('jobs/d/')).toBe(1);
    expect(existsSync(join(root, '.spare'))).toBe(false);
    expect(await read(store, 'jobs/d/in/0').catch((e: unknown) => e)).toBeInstanceOf(BlobNotFoundError);
  });

  it('under a lowered limit keeps nothing more, and writes use up what was kept', async () => {
    const { root } = await withOneSpare('lowered');
    const after = new LocalBlobStore(root, { spareBytes: 0 });
    const data = await putRandom(after, 'jobs/g/out/0', MiB + 1);
    expect(await spares(root)).toEqual([]);
    expect(sha256(await read(after, 'jobs/g/out/0'))).toBe(sha256(data));
    await after.deletePrefix('jobs/g/');
    expect(await spares(root)).toEqual([]);
  });

  it('sweeps spare files older than the cut-off', async () => {
    const { root, store } = await withOneSpare('sweep');
    const [name] = await spares(root);
    const past = new Date(Date.now() - 48 * 3600_000);
    await utimes(join(root, '.spare', name), past, past);
    expect(await store.sweepStale(new Date(Date.now() - 24 * 3600_000))).toBe(1);
    expect(await spares(root)).toEqual([]);
    // The folder removed by hand: puts and deletes go on, and it comes back.
    await rm(join(root, '.spare'), { recursive: true });
    await putRandom(store, 'jobs/e/in/1', 2 * MiB);
    await store.deletePrefix('jobs/e/');
    expect(await spares(root)).toHaveLength(1);
  });
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

/** An S3 store at `s3://kms-blobs/test-run` on a stub server answering with `handler`, for `use`. */
async function withStubS3(handler: RequestListener, use: (store: BlobStore) => Promise<void>): Promise<void> {
  const server = createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const dir = await mkdtemp(join(tmpdir(), 'blob-s3-stub-'));
  const { port } = server.address() as { port: number };
  const store = await createBlobStore('s3://kms-blobs/test-run', {
    s3: { endpoint: `http://127.0.0.1:${port}`, accessKeyId: 'x', secretAccessKey: 'x', uploadTmpDir: join(dir, 'uploads') },
    env: {},
  });
  try {
    await use(store);
  } finally {
    await store.close();
    await new Promise((resolve) => server.close(resolve));
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * s3rver answers ListMultipartUploads with 501 NotImplemented and AbortMultipartUpload with 405, so the
 * sweep of incomplete multipart uploads runs here against a stub speaking just those two calls (S3's
 * XML, paginated); against s3rver the sweep only checks that a 501 is no error (test/keys/blob-at-rest.test.ts).
 */
describe('S3 sweep of incomplete multipart uploads', () => {
  it('aborts uploads under its prefix begun before the cut-off, page after page, and keeps newer ones', async () => {
    const hour = 3600_000;
    const now = Date.now();
    const uploads = [
      { Key: 'test-run/jobs/a/out/0', UploadId: 'u1', Initiated: new Date(now - 50 * hour) },
      { Key: 'test-run/jobs/a/out/1', UploadId: 'u2', Initiated: new Date(now - 1 * hour) },
      { Key: 'test-run/jobs/b/in/0', UploadId: 'u3', Initiated: new Date(now - 30 * hour) },
      { Key: 'test-run/jobs/c/in/0', UploadId: 'u4', Initiated: new Date(now - 25 * hour) },
      { Key: 'test-run/jobs/c/in/1', UploadId: 'u5', Initiated: new Date(now) },
      { Key: 'other-app/x', UploadId: 'u6', Initiated: new Date(now - 99 * hour) },
    ];
    const aborted: string[] = [];
    const prefixes: (string | null)[] = [];
    const stub: RequestListener = (req, res) => {
      const url = new URL(req.url!, 'http://stub');
      if (req.method === 'GET' && url.pathname.replace(/\/$/, '') === '/kms-blobs' && url.searchParams.has('uploads')) {
        const prefix = url.searchParams.get('prefix');
        prefixes.push(prefix);
        const marker = url.searchParams.get('upload-id-marker');
        const matching = uploads.filter((u) => u.Key.startsWith(prefix ?? ''));
        const from = marker ? matching.findIndex((u) => u.UploadId === marker) + 1 : 0;
        const page = matching.slice(from, from + 2);
        const truncated = from + 2 < matching.length;
        const last = page.at(-1);
        res.setHeader('content-type', 'application/xml');
        res.end(
          `<?xml version="1.0" encoding="UTF-8"?><ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>kms-blobs</Bucket>` +
            `<IsTruncated>${truncated}</IsTruncated>${truncated ? `<NextKeyMarker>${last!.Key}</NextKeyMarker><NextUploadIdMarker>${last!.UploadId}</NextUploadIdMarker>` : ''}` +
            page
              .map((u) => `<Upload><Key>${u.Key}</Key><UploadId>${u.UploadId}</UploadId><Initiated>${u.Initiated.toISOString()}</Initiated></Upload>`)
              .join('') +
            `</ListMultipartUploadsResult>`,
        );
        return;
      }
      const upload = uploads.find((u) => `/kms-blobs/${u.Key}` === decodeURIComponent(url.pathname) && u.UploadId === url.searchParams.get('uploadId'));
      if (req.method === 'DELETE' && upload) {
        aborted.push(upload.UploadId);
        res.statusCode = 204;
        res.end();
        return;
      }
      res.statusCode = 500;
      res.end(`unexpected ${req.method} ${req.url}`);
    };
    await withStubS3(stub, async (store) => {
      expect(await store.sweepStale(new Date(now - 24 * hour))).toBe(3);
      expect(aborted.sort()).toEqual(['u1', 'u3', 'u4']);
      expect(prefixes).toEqual(['test-run/', 'test-run/', 'test-run/']);
    });
  });
});

describe('S3 store, refused or slowed down by the server', () => {
  // A stub that answers the first PutObject with S3's 503 SlowDown, then takes it: the SDK retries only a
  // request whose body it can send again, and the body is not hashed for the signature.
  it('retries a put of one part that S3 asks to slow down, sending the same bytes unsigned', async () => {
    const puts: { bytes: number; sha256: string | undefined }[] = [];
    const stub: RequestListener = (req, res) => {
      let bytes = 0;
      req.on('data', (chunk: Buffer) => (bytes += chunk.length));
      req.on('end', () => {
        if (req.method !== 'PUT') {
          res.statusCode = 500;
          res.end(`unexpected ${req.method} ${req.url}`);
          return;
        }
        puts.push({ bytes, sha256: req.headers['x-amz-content-sha256'] as string | undefined });
        if (puts.length === 1) {
          res.statusCode = 503;
          res.setHeader('content-type', 'application/xml');
          res.end('<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>');
          return;
        }
        res.setHeader('etag', '"stub"');
        res.end();
      });
    };
    await withStubS3(stub, async (store) => {
      const data = randomBytes(3 * MiB + 5);
      expect(await store.put('jobs/j1/out/0', Readable.from(chunks(data, MiB)))).toEqual({ size: data.length });
      expect(puts).toEqual([
        { bytes: data.length, sha256: 'UNSIGNED-PAYLOAD' },
        { bytes: data.length, sha256: 'UNSIGNED-PAYLOAD' },
      ]);
    });
  });

  it("rejects a put of several parts with the server's error and closes its source", async () => {
    const h = await s3Harness('s3://no-such-bucket');
    try {
      let left = 40;
      const source = new Readable({
        read() {
          this.push(left-- > 0 ? randomBytes(MiB) : null);
        },
      });
      await expect(h.store.put('jobs/j1/out/0', source)).rejects.toMatchObject({ name: 'NoSuchBucket' });
      expect(source.destroyed).toBe(true);
    } finally {
      await h.close();
    }
  });
});
