import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes, randomUUID } from 'node:crypto';
import { copyFile, mkdtemp, readFile, readdir, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { LocalBlobStore, createBlobStore, type BlobStore } from '../../lib/blob';
import { plaintextSize, sealedJobBlobs, sealedSize } from '../../lib/blob/sealed';
import { AppError } from '../../lib/errors';
import { createSealer } from '../../lib/sealer';
import { startS3 } from '../support/s3';

/** Job blobs sealed at rest: round trips at the chunk boundaries, and every kind of tampering refused. */
const MiB = 1 << 20;
const H = 21; // header: magic, version, salt
const C = MiB + 16; // a full sealed chunk
let dir: string;
let raw: LocalBlobStore;
let store: BlobStore;
const masterKey = `t1:${randomBytes(32).toString('base64')}`;
/** The same store as seen by another process: nothing cached. */
const fresh = () => sealedJobBlobs(raw, createSealer(masterKey));

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kms-sealed-'));
  raw = new LocalBlobStore(dir);
  store = sealedJobBlobs(raw, createSealer(masterKey));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** `data` as a stream of pieces of `piece` bytes (default: two halves). */
function source(data: Buffer, piece?: number): Readable {
  if (!piece) return Readable.from([data.subarray(0, data.length >> 1), data.subarray(data.length >> 1)]);
  return Readable.from((function* () {
    for (let at = 0; at < data.length; at += piece) yield data.subarray(at, at + piece);
  })());
}
const put = (key: string, data: Buffer, s: BlobStore = store) => s.put(key, source(data));
const read = async (key: string, s: BlobStore = store) => buffer(await s.get(key));
const failure = (key: string, s: BlobStore = store) => read(key, s).then(() => undefined, (err: unknown) => err as Error);
const fails = (key: string, s: BlobStore = store) => failure(key, s).then((err) => err?.message ?? 'read');
const rawPath = (key: string) => join(dir, key);

/** Reads a blob until it fails; returns what came out before the failure. */
async function readUntilFailure(key: string): Promise<{ got: Buffer; error?: Error }> {
  const parts: Buffer[] = [];
  try {
    for await (const chunk of await store.get(key)) parts.push(chunk as Buffer);
    return { got: Buffer.concat(parts) };
  } catch (err) {
    return { got: Buffer.concat(parts), error: err as Error };
  }
}

describe('sealed job blobs', () => {
  it.each([0, 1, MiB - 1, MiB, MiB + 1, 3 * MiB])('round-trips %i bytes; the stored bytes are not the plaintext; stat gives the plaintext size', async (size) => {
    const key = `jobs/${randomUUID()}/in/0`;
    const data = Buffer.alloc(size, 'secret plaintext ');
    expect((await put(key, data)).size).toBe(size);
    expect(Buffer.compare(await read(key), data)).toBe(0);
    expect(Buffer.compare(await read(key, fresh()), data)).toBe(0);
    expect(await store.stat(key)).toEqual({ size });
    const stored = await readFile(rawPath(key));
    expect(stored.length).toBe(sealedSize(size));
    expect(plaintextSize(stored.length)).toBe(size);
    if (size > 16) expect(stored.includes(data.subarray(0, 17))).toBe(false);
    expect((await readFile(rawPath(key.replace(/in\/0$/, 'key')))).toString()).toMatch(/^s1\./);
  });

  it.each([
    ['one buffer', 3 * MiB + 5, 0],
    ['odd pieces', 2 * MiB + 3, 4093],
    ['pieces straddling the chunk size', 3 * MiB, MiB + 1],
  ])('round-trips a source of %s, reporting plaintext progress', async (_what, size, piece) => {
    const key = `jobs/${randomUUID()}/in/0`;
    const data = randomBytes(size);
    const progress: number[] = [];
    const src = piece ? source(data, piece) : Readable.from([data]);
    expect(await store.put(key, src, { onProgress: (n) => progress.push(n) })).toEqual({ size });
    expect(progress.at(-1)).toBe(size);
    expect(Buffer.compare(await read(key, fresh()), data)).toBe(0);
  });

  it('refuses a flipped byte, swapped or dropped chunks, truncation, extension and a blob moved to another key or job', async () => {
    const job = randomUUID();
    const key = `jobs/${job}/in/0`;
    const data = randomBytes(3 * MiB + 10);
    await put(key, data);
    const sealed = await readFile(rawPath(key));
    const chunk = (i: number) => sealed.subarray(H + i * C, Math.min(sealed.length, H + (i + 1) * C));
    const flip = (at: number) => Buffer.from(sealed).fill(sealed[at]! ^ 1, at, at + 1);
    const variants: Record<string, Buffer> = {
      flippedFirstChunk: flip(H + 5),
      flippedTag: flip(H + C - 1),
      flippedFinalChunk: flip(sealed.length - 20),
      flippedSalt: flip(10),
      flippedVersion: flip(4),
      swapped: Buffer.concat([sealed.subarray(0, H), chunk(1), chunk(0), chunk(2), chunk(3)]),
      dropped: Buffer.concat([sealed.subarray(0, H), chunk(0), chunk(2), chunk(3)]),
      truncatedToChunk: Buffer.concat([sealed.subarray(0, H), chunk(0), chunk(1), chunk(2)]),
      truncated: sealed.subarray(0, sealed.length - 3),
      extended: Buffer.concat([sealed, chunk(3)]),
      extendedByBytes: Buffer.concat([sealed, Buffer.alloc(1)]),
      header: sealed.subarray(0, H),
      empty: Buffer.alloc(0),
      plaintext: data,
    };
    for (const [name, bytes] of Object.entries(variants)) {
      await writeFile(rawPath(key), bytes);
      const err = await failure(key);
      expect(err, name).toBeInstanceOf(Error);
      // A plain Error (a 500 and a retry, never a client's fault), carrying no bytes of the blob.
      expect(err, name).not.toBeInstanceOf(AppError);
    }
    await writeFile(rawPath(key), sealed);
    expect(Buffer.compare(await read(key), data)).toBe(0);
    // Moved to another name in the same job, or into another job (with that job's key file copied too).
    await writeFile(rawPath(`jobs/${job}/in/1`), sealed);
    expect(await fails(`jobs/${job}/in/1`)).toMatch(/authentication/);
    const other = randomUUID();
    await put(`jobs/${other}/in/0`, Buffer.from('x'));
    await writeFile(rawPath(`jobs/${other}/in/0`), sealed);
    expect(await fails(`jobs/${other}/in/0`)).not.toBe('read');
    await copyFile(rawPath(`jobs/${job}/key`), rawPath(`jobs/${other}/key`));
    expect(await fails(`jobs/${other}/in/0`, fresh())).not.toBe('read'); // the data key is bound to its job id
  });

  it('yields nothing of a chunk that fails: only the verified chunks before it', async () => {
    const key = `jobs/${randomUUID()}/in/0`;
    const data = randomBytes(3 * MiB + 10);
    await put(key, data);
    const sealed = await readFile(rawPath(key));
    sealed[H + 2 * C + 100]! ^= 0x80; // in chunk 2
    await writeFile(rawPath(key), sealed);
    const { got, error } = await readUntilFailure(key);
    expect(error?.message).toMatch(/chunk 2 failed authentication/);
    expect(got.length).toBe(2 * MiB);
    expect(Buffer.compare(got, data.subarray(0, 2 * MiB))).toBe(0);
  });

  it('refuses byte ranges, impossible sizes, the key blob and jobs/ keys without a job id', async () => {
    const job = randomUUID();
    const key = `jobs/${job}/in/0`;
    await put(key, randomBytes(MiB + 3));
    await expect(store.get(key, { start: 0, end: 9 })).rejects.toThrow(/byte ranges/);
    await writeFile(rawPath(key), (await readFile(rawPath(key))).subarray(0, H + C));
    await expect(store.stat(key)).rejects.toThrow(/not the size of a sealed blob/);
    for (const bad of [`jobs/${job}/key`, 'jobs/j1/in/0', `jobs/${job.toUpperCase()}/in/0`, 'jobs/x']) {
      await expect(store.put(bad, Readable.from([Buffer.from('x')])), bad).rejects.toThrow(TypeError);
      await expect(store.get(bad), bad).rejects.toThrow(TypeError);
    }
    expect((await readFile(rawPath(`jobs/${job}/key`))).toString()).toMatch(/^s1\./);
    await expect(readFile(rawPath('jobs/j1/in/0'))).rejects.toThrow();
  });

  it('cannot be read without the master key, nor without the job data key', async () => {
    const job = randomUUID();
    await put(`jobs/${job}/in/0`, Buffer.from('secret'));
    const otherMaster = sealedJobBlobs(raw, createSealer(`t2:${randomBytes(32).toString('base64')}`));
    expect(await fails(`jobs/${job}/in/0`, otherMaster)).not.toBe('read');
    await rm(rawPath(`jobs/${job}/key`));
    expect(await fails(`jobs/${job}/in/0`, fresh())).toMatch(/no data key/);
  });

  it('never makes a data key for an output: only the first input of a job does (a worker would seal with a key of its own)', async () => {
    const job = randomUUID();
    await expect(put(`jobs/${job}/out/0`, Buffer.from('x'))).rejects.toThrow(/no data key/);
    await put(`jobs/${job}/in/0`, Buffer.from('input'));
    await put(`jobs/${job}/out/0`, Buffer.from('output'));
    expect((await read(`jobs/${job}/out/0`)).toString()).toBe('output');
  });

  it('gives concurrent puts of one job one data key (several files of one upload)', async () => {
    const job = randomUUID();
    const files = [0, 1, 2, 3].map(() => randomBytes(1000));
    await Promise.all(files.map((data, n) => put(`jobs/${job}/in/${n}`, data)));
    const other = fresh();
    for (const [n, data] of files.entries()) expect(Buffer.compare(await read(`jobs/${job}/in/${n}`, other), data)).toBe(0);
  });

  it('forgets a data key with its job folder: a job written again gets a key file again', async () => {
    const job = randomUUID();
    await put(`jobs/${job}/in/0`, Buffer.from('first'));
    expect(await store.deletePrefix(`jobs/${job}/`)).toBe(2);
    await put(`jobs/${job}/in/0`, Buffer.from('second'));
    expect((await read(`jobs/${job}/in/0`, fresh())).toString()).toBe('second');
  });

  it('deletes a put that fails midway and the source with it', async () => {
    const job = randomUUID();
    let sent = 0;
    const broken = new Readable({
      read() {
        if (sent >= 3 * MiB) return this.destroy(new Error('source broke'));
        sent += MiB;
        this.push(randomBytes(MiB));
      },
    });
    await expect(store.put(`jobs/${job}/in/0`, broken)).rejects.toThrow('source broke');
    expect(await store.stat(`jobs/${job}/in/0`)).toBeNull();
    expect(await readdir(join(dir, '.tmp'))).toEqual([]);
  });

  it('passes keys outside jobs/ through unchanged', async () => {
    await store.put('other/plain', Readable.from([Buffer.from('as is')]));
    expect((await readFile(rawPath('other/plain'))).toString()).toBe('as is');
    expect((await buffer(await store.get('other/plain', { start: 3 }))).toString()).toBe('is');
  });

  it('sweeps temporary files older than the cut-off and keeps fresh ones', async () => {
    const tmp = join(dir, '.tmp');
    await writeFile(join(tmp, 'old'), 'crash leftover');
    await writeFile(join(tmp, 'fresh'), 'in progress');
    const past = new Date(Date.now() - 48 * 3600_000);
    await utimes(join(tmp, 'old'), past, past);
    expect(await store.sweepStale(new Date(Date.now() - 24 * 3600_000))).toBe(1);
    expect(await readdir(tmp)).toEqual(['fresh']);
    expect((await stat(join(tmp, 'fresh'))).isFile()).toBe(true);
    await rm(join(tmp, 'fresh'));
  });
});

describe('sealed job blobs on the S3 driver (s3rver)', () => {
  it('round-trip, hold no plaintext in the bucket and refuse a changed object', async () => {
    const s3dir = await mkdtemp(join(tmpdir(), 'kms-sealed-s3-'));
    const s3 = await startS3(s3dir);
    const rawS3 = await createBlobStore(s3.env.BLOB_STORE_URL, { s3: { endpoint: s3.endpoint, region: 'us-east-1', accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER', partSize: 5 * MiB }, env: {} });
    const sealedS3 = sealedJobBlobs(rawS3, createSealer(masterKey));
    try {
      const job = randomUUID();
      for (const size of [0, MiB, 6 * MiB + 1]) {
        const key = `jobs/${job}/in/${size}`;
        const data = Buffer.alloc(size, 'S3-PLAINTEXT-MARKER ');
        expect((await put(key, data, sealedS3)).size).toBe(size);
        expect(await sealedS3.stat(key)).toEqual({ size });
        expect(Buffer.compare(await read(key, sealedS3), data)).toBe(0);
        const stored = await buffer(await rawS3.get(key));
        expect(stored.length).toBe(sealedSize(size));
        expect(stored.includes('S3-PLAINTEXT-MARKER')).toBe(false);
      }
      const key = `jobs/${job}/in/${6 * MiB + 1}`;
      const stored = await buffer(await rawS3.get(key));
      stored[H + C + 7]! ^= 1;
      await rawS3.put(key, Readable.from([stored]));
      expect(await fails(key, sealedS3)).toMatch(/chunk 1 failed authentication/);
      // Every object under the job is sealed: its data key included.
      expect((await buffer(await rawS3.get(`jobs/${job}/key`))).toString()).toMatch(/^s1\./);
      expect(await sealedS3.deletePrefix(`jobs/${job}/`)).toBe(4);
    } finally {
      await sealedS3.close();
      await s3.close();
      await rm(s3dir, { recursive: true, force: true });
    }
  });
});
