import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtemp, readFile, readdir, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { LocalBlobStore, createBlobStore, type BlobStore } from '../../lib/blob';
import { plaintextSize, sealedJobBlobs, sealedSize } from '../../lib/blob/sealed';
import { jobDataKeys } from '../../lib/blob/data-keys';
import { AppError } from '../../lib/errors';
import { createSealer } from '../../lib/sealer';
import { release } from '../../lib/single-use';
import { startS3 } from '../support/s3';
import { jobKeyRows } from '../support/job-keys';

/** Job blobs sealed at rest: round trips at the chunk boundaries, and every kind of tampering refused. */
const MiB = 1 << 20;
const H = 21; // header: magic, version, salt
const C = MiB + 16; // a full sealed chunk
let dir: string;
let raw: LocalBlobStore;
let store: BlobStore;
const masterKey = `t1:${randomBytes(32).toString('base64')}`;
let jobs: ReturnType<typeof jobKeyRows>;
/** The same store as seen by another process: no data key in memory. */
const fresh = () => sealedJobBlobs(raw, jobs.keys());
const newJob = () => jobs.newJob();

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kms-sealed-'));
  raw = new LocalBlobStore(dir);
  jobs = jobKeyRows(createSealer(masterKey), raw);
  store = fresh();
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** `data` as a stream of pieces of `piece` bytes (default: two halves). */
function source(data: Buffer, piece?: number): Readable {
  if (!piece) return Readable.from([data.subarray(0, data.length >> 1), data.subarray(data.length >> 1)]);
  return Readable.from(
    (function* () {
      for (let at = 0; at < data.length; at += piece) yield data.subarray(at, at + piece);
    })(),
  );
}
const put = (key: string, data: Buffer, s: BlobStore = store) => s.put(key, source(data));
const read = async (key: string, s: BlobStore = store) => buffer(await s.get(key));
const failure = (key: string, s: BlobStore = store) =>
  read(key, s).then(
    () => undefined,
    (err: unknown) => err as Error,
  );
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
  it.each([0, 1, MiB - 1, MiB, MiB + 1, 3 * MiB])(
    'round-trips %i bytes; the stored bytes are not the plaintext; stat gives the plaintext size',
    async (size) => {
      const key = `jobs/${newJob()}/in/0`;
      const data = Buffer.alloc(size, 'secret plaintext ');
      expect((await put(key, data)).size).toBe(size);
      expect(Buffer.compare(await read(key), data)).toBe(0);
      expect(Buffer.compare(await read(key, fresh()), data)).toBe(0);
      expect(await store.stat(key)).toEqual({ size });
      const stored = await readFile(rawPath(key));
      expect(stored.length).toBe(sealedSize(size));
      expect(plaintextSize(stored.length)).toBe(size);
      if (size > 16) expect(stored.includes(data.subarray(0, 17))).toBe(false);
    },
  );

  it.each([
    ['one buffer', 3 * MiB + 5, 0],
    ['odd pieces', 2 * MiB + 3, 4093],
    ['pieces straddling the chunk size', 3 * MiB, MiB + 1],
  ])('round-trips a source of %s, reporting plaintext progress', async (_what, size, piece) => {
    const key = `jobs/${newJob()}/in/0`;
    const data = randomBytes(size);
    const progress: number[] = [];
    const src = piece ? source(data, piece) : Readable.from([data]);
    expect(await store.put(key, src, { onProgress: (n) => progress.push(n) })).toEqual({ size });
    expect(progress.at(-1)).toBe(size);
    expect(Buffer.compare(await read(key, fresh()), data)).toBe(0);
  });

  it('hands the chunks it reads on single-use, and leaves whole what it was given to store', async () => {
    const key = `jobs/${newJob()}/in/0`;
    const data = randomBytes(2 * MiB + 5);
    await store.put(key, Readable.from([data]));
    expect(data.length).toBe(2 * MiB + 5);
    const chunks: Buffer[] = [];
    for await (const chunk of await fresh().get(key)) chunks.push(chunk as Buffer);
    expect(Buffer.concat(chunks).equals(data)).toBe(true);
    for (const chunk of chunks) release(chunk);
    expect(chunks.every((chunk) => chunk.length === 0)).toBe(true);
  });

  it('refuses a flipped byte, swapped or dropped chunks, truncation, extension and a blob moved to another key or job', async () => {
    const job = newJob();
    const key = `jobs/${job}/in/0`;
    const data = randomBytes(3 * MiB + 10);
    await put(key, data);
    const sealed = await readFile(rawPath(key));
    const chunk = (i: number) => sealed.subarray(H + i * C, Math.min(sealed.length, H + (i + 1) * C));
    const flip = (at: number) => Buffer.from(sealed).fill(sealed[at] ^ 1, at, at + 1);
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
    // Moved to another name in the same job, or into another job (with the job's data key copied to that row too).
    await writeFile(rawPath(`jobs/${job}/in/1`), sealed);
    expect(await fails(`jobs/${job}/in/1`)).toMatch(/authentication/);
    const other = newJob();
    await put(`jobs/${other}/in/0`, Buffer.from('x'));
    await writeFile(rawPath(`jobs/${other}/in/0`), sealed);
    expect(await fails(`jobs/${other}/in/0`)).not.toBe('read');
    jobs.rows.set(other, jobs.rows.get(job)!);
    expect(await fails(`jobs/${other}/in/0`, fresh())).not.toBe('read'); // the data key is bound to its job id
  });

  it('yields nothing of a chunk that fails: only the verified chunks before it', async () => {
    const key = `jobs/${newJob()}/in/0`;
    const data = randomBytes(3 * MiB + 10);
    await put(key, data);
    const sealed = await readFile(rawPath(key));
    sealed[H + 2 * C + 100] ^= 0x80; // in chunk 2
    await writeFile(rawPath(key), sealed);
    const { got, error } = await readUntilFailure(key);
    expect(error?.message).toMatch(/chunk 2 failed authentication/);
    expect(got.length).toBe(2 * MiB);
    expect(Buffer.compare(got, data.subarray(0, 2 * MiB))).toBe(0);
  });

  it('refuses byte ranges, impossible sizes, the legacy key blob and jobs/ keys without a job id', async () => {
    const job = newJob();
    const key = `jobs/${job}/in/0`;
    await put(key, randomBytes(MiB + 3));
    await expect(store.get(key, { start: 0, end: 9 })).rejects.toThrow(/byte ranges/);
    await writeFile(rawPath(key), (await readFile(rawPath(key))).subarray(0, H + C));
    await expect(store.stat(key)).rejects.toThrow(/not the size of a sealed blob/);
    for (const bad of [`jobs/${job}/key`, 'jobs/j1/in/0', `jobs/${job.toUpperCase()}/in/0`, 'jobs/x']) {
      await expect(store.put(bad, Readable.from([Buffer.from('x')])), bad).rejects.toThrow(TypeError);
      await expect(store.get(bad), bad).rejects.toThrow(TypeError);
    }
    await expect(readFile(rawPath(`jobs/${job}/key`))).rejects.toThrow();
    await expect(readFile(rawPath('jobs/j1/in/0'))).rejects.toThrow();
  });

  it('cannot be read without the master key, nor without the job data key', async () => {
    const job = newJob();
    await put(`jobs/${job}/in/0`, Buffer.from('secret'));
    const otherMaster = sealedJobBlobs(raw, jobs.keys(createSealer(`t2:${randomBytes(32).toString('base64')}`)));
    expect(await fails(`jobs/${job}/in/0`, otherMaster)).not.toBe('read');
    jobs.rows.delete(job);
    expect(await fails(`jobs/${job}/in/0`, fresh())).toMatch(/no data key/);
  });

  it('writes nothing for a job without a data key (no row, or not minted)', async () => {
    const job = randomUUID();
    for (const key of [`jobs/${job}/in/0`, `jobs/${job}/out/0`]) {
      await expect(put(key, Buffer.from('x')), key).rejects.toThrow(/no data key/);
      expect(await raw.stat(key)).toBeNull();
    }
  });

  it('holds a minted key in memory until its upload is released (a blob may come before the row), then reads the row', async () => {
    const keys = jobs.keys();
    const api = sealedJobBlobs(raw, keys);
    const job = randomUUID();
    const sealed = keys.mint(job);
    expect(sealed).toMatch(/^s1\./);
    // Another job's key in memory cannot stand in: each is sealed with its own job id as AAD.
    expect(() => keys.admit(randomUUID(), sealed)).toThrow();
    await put(`jobs/${job}/recipient.asc`, Buffer.from('before the row'), api);
    expect(await fails(`jobs/${job}/recipient.asc`)).toMatch(/no data key/); // no row yet
    jobs.rows.set(job, sealed);
    keys.release(job);
    expect((await read(`jobs/${job}/recipient.asc`, api)).toString()).toBe('before the row');
    expect((await read(`jobs/${job}/recipient.asc`, fresh())).toString()).toBe('before the row');
  });

  it("takes a job's key from its row when handed over (admit), and looks a job's key up once for concurrent reads", async () => {
    const job = newJob();
    const files = [0, 1, 2, 3].map(() => randomBytes(1000));
    await Promise.all(files.map((data, n) => put(`jobs/${job}/in/${n}`, data)));
    const before = jobs.lookups();
    const admitted = jobs.keys();
    admitted.admit(job, jobs.rows.get(job)!);
    expect(Buffer.compare(await read(`jobs/${job}/in/0`, sealedJobBlobs(raw, admitted)), files[0])).toBe(0);
    expect(jobs.lookups()).toBe(before);
    const other = fresh();
    const read4 = await Promise.all(files.map((_, n) => read(`jobs/${job}/in/${n}`, other)));
    for (const [n, data] of files.entries()) expect(Buffer.compare(read4[n], data)).toBe(0);
    expect(jobs.lookups()).toBe(before + 1);
  });

  it("forgets a job's key once its folder is deleted (not when only its inputs are)", async () => {
    const job = newJob();
    await put(`jobs/${job}/in/0`, randomBytes(100));
    await put(`jobs/${job}/out/0`, randomBytes(100));
    const s = fresh();
    await read(`jobs/${job}/out/0`, s);
    const before = jobs.lookups();
    await s.deletePrefix(`jobs/${job}/in/`);
    await read(`jobs/${job}/out/0`, s);
    expect(jobs.lookups()).toBe(before); // still held
    await s.deletePrefix(`jobs/${job}/`);
    await put(`jobs/${job}/out/1`, randomBytes(100), s); // a write after the deletion looks the key up again
    expect(jobs.lookups()).toBe(before + 1);
  });

  it('reads and extends the blobs of a job from before data keys were kept in rows (its key file beside them)', async () => {
    const job = randomUUID();
    const old = jobDataKeys(createSealer(masterKey)); // the previous version kept this key in jobs/<id>/key
    await raw.put(`jobs/${job}/key`, Readable.from([Buffer.from(old.mint(job))]));
    await put(`jobs/${job}/in/0`, Buffer.from('written by the previous version'), sealedJobBlobs(raw, old));
    const worker = fresh();
    expect((await read(`jobs/${job}/in/0`, worker)).toString()).toBe('written by the previous version');
    await put(`jobs/${job}/out/0`, Buffer.from('output'), worker);
    expect((await read(`jobs/${job}/out/0`, fresh())).toString()).toBe('output');
    expect(await store.deletePrefix(`jobs/${job}/`)).toBe(3);
  });

  it('deletes a put that fails midway and the source with it', async () => {
    const job = newJob();
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
    const rawS3 = await createBlobStore(s3.env.BLOB_STORE_URL, {
      s3: { endpoint: s3.endpoint, region: 'us-east-1', accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER', partSize: 5 * MiB },
      env: {},
    });
    const sealedS3 = sealedJobBlobs(rawS3, jobs.keys());
    try {
      const job = newJob();
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
      stored[H + C + 7] ^= 1;
      await rawS3.put(key, Readable.from([stored]));
      expect(await fails(key, sealedS3)).toMatch(/chunk 1 failed authentication/);
      expect(await sealedS3.deletePrefix(`jobs/${job}/`)).toBe(3);
    } finally {
      await sealedS3.close();
      await s3.close();
      await rm(s3dir, { recursive: true, force: true });
    }
  });
});
