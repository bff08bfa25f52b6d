import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtemp, readFile, readdir, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { LocalBlobStore, type BlobStore } from '../../lib/blob';
import { sealedJobBlobs } from '../../lib/blob/sealed';
import { createSealer } from '../../lib/sealer';

/** Job blobs sealed at rest: round trips at the chunk boundaries, and every kind of tampering refused. */
const MiB = 1 << 20;
let dir: string;
let raw: LocalBlobStore;
let store: BlobStore;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kms-sealed-'));
  raw = new LocalBlobStore(dir);
  store = sealedJobBlobs(raw, createSealer(`t1:${randomBytes(32).toString('base64')}`));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const put = (key: string, data: Buffer) => store.put(key, Readable.from([data.subarray(0, data.length >> 1), data.subarray(data.length >> 1)]));
const read = async (key: string) => buffer(await store.get(key));
const fails = (key: string) => read(key).then(() => 'read', (err: unknown) => (err as Error).message);
const rawPath = (key: string) => join(dir, key);

describe('sealed job blobs', () => {
  it.each([0, 1, MiB - 1, MiB, MiB + 1, 3 * MiB])('round-trips %i bytes; the stored bytes are not the plaintext; stat gives the plaintext size', async (size) => {
    const key = `jobs/${randomUUID()}/in/0`;
    const data = Buffer.alloc(size, 'secret plaintext ');
    expect((await put(key, data)).size).toBe(size);
    expect(Buffer.compare(await read(key), data)).toBe(0);
    expect(await store.stat(key)).toEqual({ size });
    const stored = await readFile(rawPath(key));
    if (size > 16) expect(stored.includes(data.subarray(0, 17))).toBe(false);
    expect((await readFile(rawPath(key.replace(/in\/0$/, 'key')))).toString()).toMatch(/^s1\./);
  });

  it('refuses a flipped byte, swapped or dropped chunks, truncation, extension and a blob moved to another key or job', async () => {
    const job = randomUUID();
    const key = `jobs/${job}/out/0`;
    const data = randomBytes(3 * MiB + 10);
    await put(key, data);
    const sealed = await readFile(rawPath(key));
    const H = 21;
    const C = MiB + 16;
    const chunk = (i: number) => sealed.subarray(H + i * C, Math.min(sealed.length, H + (i + 1) * C));
    const variants: Record<string, Buffer> = {
      flipped: Buffer.from(sealed).fill(sealed[H + 5]! ^ 1, H + 5, H + 6),
      swapped: Buffer.concat([sealed.subarray(0, H), chunk(1), chunk(0), chunk(2), chunk(3)]),
      dropped: Buffer.concat([sealed.subarray(0, H), chunk(0), chunk(2), chunk(3)]),
      truncatedToChunk: Buffer.concat([sealed.subarray(0, H), chunk(0), chunk(1), chunk(2)]),
      truncated: sealed.subarray(0, sealed.length - 3),
      extended: Buffer.concat([sealed, chunk(3)]),
      header: sealed.subarray(0, H),
    };
    for (const [name, bytes] of Object.entries(variants)) {
      await writeFile(rawPath(key), bytes);
      expect(await fails(key), name).not.toBe('read');
    }
    await writeFile(rawPath(key), sealed);
    expect(Buffer.compare(await read(key), data)).toBe(0);
    // Moved to another name in the same job, or into another job (with that job's key file copied too).
    await writeFile(rawPath(`jobs/${job}/out/1`), sealed);
    expect(await fails(`jobs/${job}/out/1`)).toMatch(/authentication/);
    const other = randomUUID();
    await put(`jobs/${other}/out/0`, Buffer.from('x'));
    await writeFile(rawPath(`jobs/${other}/out/0`), sealed);
    expect(await fails(`jobs/${other}/out/0`)).not.toBe('read');
  });

  it('gives concurrent puts of one job one data key (several files of one upload)', async () => {
    const job = randomUUID();
    const files = [0, 1, 2, 3].map(() => randomBytes(1000));
    await Promise.all(files.map((data, n) => put(`jobs/${job}/in/${n}`, data)));
    for (const [n, data] of files.entries()) expect(Buffer.compare(await read(`jobs/${job}/in/${n}`), data)).toBe(0);
  });

  it('passes keys outside jobs/ through unchanged', async () => {
    await store.put('other/plain', Readable.from([Buffer.from('as is')]));
    expect((await readFile(rawPath('other/plain'))).toString()).toBe('as is');
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
  });
});
