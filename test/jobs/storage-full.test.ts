import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createKey, waitJob } from '../support/keys';
import { startWorkers } from '../../workers/worker';

// A blob store on a small tmpfs of its own fills up for real; mounting one needs root (as CI runs).
const root = process.getuid?.() === 0;
const mountpoint = mkdtempSync(join(tmpdir(), 'kms-full-'));
let s: TestService;

beforeAll(async () => {
  if (!root) return;
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=3m', 'tmpfs', mountpoint]);
  // Workers are started by the test that needs them, once the disk is as it wants.
  s = await startTestService({ roles: ['web'], env: { BLOB_STORE_URL: join(mountpoint, 'blobs'), BLOB_SPARE_MB: '0' } });
});
afterAll(async () => {
  await s?.stop();
  if (root) execFileSync('umount', ['-l', mountpoint]);
  rmSync(mountpoint, { recursive: true, force: true });
});

/** Regular files under the store, the folders of temporary files included. */
const filesUnder = (dir: string): string[] =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? filesUnder(join(dir, e.name)) : [join(dir, e.name)]));

const blobs = () => join(mountpoint, 'blobs');
/** What a job left in the store: every file but the store's own hidden folders. */
const leftOver = () => filesUnder(blobs()).filter((f) => !f.slice(blobs().length).includes('/.'));

describe.skipIf(!root)('a full blob store', () => {
  it('answers an upload that does not fit 507 storage_full, and keeps nothing of it', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const res = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, files: [{ name: 'big.bin', data: randomBytes(4 << 20) }] },
    });
    expect([res.status, res.body.code], JSON.stringify(res.body)).toEqual([507, 'storage_full']);
    expect(res.headers.get('retry-after')).toMatch(/^\d+$/);
    await expect.poll(leftOver, { timeout: 10_000 }).toEqual([]);
  });

  it('fails a job whose output does not fit at once with storage_full (no retries), and deletes what it wrote', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const res = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, files: [{ name: 'a.bin', data: randomBytes(1 << 20) }] },
    });
    expect(res.status).toBe(202);
    // The upload is stored; now the disk fills up before a worker takes the job.
    const filler = join(mountpoint, 'filler');
    try {
      execFileSync('sh', ['-c', `dd if=/dev/zero of=${filler} bs=64k 2>/dev/null || true`]);
      const pool = await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
      try {
        const job = await waitJob(s.api, u.token, res.body.job_id);
        expect([job.state, job.error?.code]).toEqual(['failed', 'storage_full']);
        expect((await s.c.db('jobs').where({ id: res.body.job_id }).first()).attempts).toBe(1);
      } finally {
        await pool.close();
      }
    } finally {
      rmSync(filler, { force: true });
    }
    await expect.poll(leftOver, { timeout: 10_000 }).toEqual([]);
    const small = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, files: [{ name: 'b.txt', data: Buffer.from('hello') }] },
    });
    expect(small.status).toBe(202);
  });
});
