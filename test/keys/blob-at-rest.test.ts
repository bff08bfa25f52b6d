import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { mkdtemp, readFile, readdir, rm, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, waitJob } from '../support/keys';
import { startWorkers } from '../../workers/worker';
import { startS3 } from '../support/s3';
import { createBlobStore } from '../../lib/blob';

/** A copy of the blob store alone reveals nothing: uploads and decrypted outputs are sealed at rest. */
let s: TestService;
beforeAll(async () => {
  s = await startTestService({ roles: ['web'] });
});
afterAll(async () => {
  await s?.stop();
});

/** Every file's bytes; a temp file or folder removed while the tree is walked (a put finishing) is skipped. */
async function everyBlobFile(): Promise<Buffer> {
  const unlessGone =
    <T>(fallback: T) =>
    (err: unknown): T => {
      if ((err as { code?: string }).code === 'ENOENT') return fallback;
      throw err;
    };
  async function walk(dir: string): Promise<Buffer[]> {
    const entries = await readdir(dir, { withFileTypes: true }).catch(unlessGone([]));
    const parts = await Promise.all(
      entries.map(async (e) => (e.isDirectory() ? walk(join(dir, e.name)) : e.isFile() ? readFile(join(dir, e.name)).then((b) => [b], unlessGone([])) : [])),
    );
    return parts.flat();
  }
  return Buffer.concat(await walk(s.env.BLOB_STORE_URL));
}

describe('job blobs at rest', () => {
  it('hold no plaintext: neither an upload waiting for its job nor a decrypted output', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const marker = Buffer.from('PLAINTEXT-MARKER-'.repeat(4096));

    // No workers yet: the upload waits in the blob store.
    const res = await s.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files: [{ name: 'm.txt', data: marker }] } });
    expect(res.status).toBe(202);
    expect((await everyBlobFile()).includes('PLAINTEXT-MARKER-')).toBe(false);

    const pool = await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
    try {
      expect((await waitJob(s.api, u.token, res.body.job_id)).state).toBe('completed');
      // Then its uploads go, markers and segments (just after the job is announced); its output stays.
      const jobDir = join(s.env.BLOB_STORE_URL, 'jobs', res.body.job_id);
      await vi.waitUntil(async () => !(await readdir(jobDir)).includes('in'), { timeout: 5000 });
      expect(await readdir(join(jobDir, 'out'))).toContain('0');
      const ciphertext = await download(s.api, u.token, res.body.job_id);
      const dec = await s.api('POST', '/keys/decrypt', {
        token: u.token,
        form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'm.gpg', data: ciphertext }] },
      });
      expect((await waitJob(s.api, u.token, dec.body.job_id)).state).toBe('completed');
      expect(Buffer.compare(await download(s.api, u.token, dec.body.job_id), marker)).toBe(0);
      expect((await everyBlobFile()).includes('PLAINTEXT-MARKER-')).toBe(false);
      // Its blobs open only with the job's data key, kept in its row sealed under the master key, not beside them.
      expect((await s.c.db('jobs').where({ id: dec.body.job_id }).first('data_key')).data_key).toMatch(/^s1\./);
      expect(await readdir(join(s.env.BLOB_STORE_URL, 'jobs', dec.body.job_id))).not.toContain('key');
    } finally {
      await pool.close();
    }
  });
});

describe('the sweep-blobs job', () => {
  it('runs on the maintenance queue and removes leftovers older than BLOB_TMP_MAX_AGE_HOURS, keeping fresh ones', async () => {
    const root = s.env.BLOB_STORE_URL;
    const old = new Date(Date.now() - (s.c.config.blobTmpMaxAgeHours + 1) * 3600_000);
    for (const d of ['.tmp', '.uploads']) {
      await writeFile(join(root, d, 'crashed'), 'PLAINTEXT-MARKER left by a crash');
      await utimes(join(root, d, 'crashed'), old, old);
      await writeFile(join(root, d, 'in-progress'), 'still being written');
    }
    const pool = await startWorkers(s.c, [{ queue: 'maintenance', concurrency: 1 }]);
    try {
      const id = await s.c.jobs.enqueue('sweep-blobs', {});
      const queue = s.c.jobs.queue('maintenance');
      await expect.poll(async () => (await queue.getJob(id))?.finishedOn !== undefined, { timeout: 10_000 }).toBe(true);
      expect((await queue.getJob(id))?.returnvalue).toEqual({ removed: 2 });
    } finally {
      await pool.close();
    }
    for (const d of ['.tmp', '.uploads']) expect(await readdir(join(root, d))).toEqual(['in-progress']);
  });
});

describe('the S3 driver', () => {
  it('sweeps old upload temp files; a store without ListMultipartUploads (s3rver) is no error', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kms-s3-sweep-'));
    const s3 = await startS3(dir);
    const store = await createBlobStore(s3.env.BLOB_STORE_URL, {
      s3: { endpoint: s3.endpoint, region: 'us-east-1', accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER' },
    });
    try {
      const old = join(store.uploadTmpDir, `stale-${Date.now()}`);
      await writeFile(old, 'left by a crash');
      const past = new Date(Date.now() - 48 * 3600_000);
      await utimes(old, past, past);
      expect(await store.sweepStale(new Date(Date.now() - 24 * 3600_000))).toBeGreaterThanOrEqual(1);
      await expect(readFile(old)).rejects.toThrow();
    } finally {
      await store.close();
      await s3.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
