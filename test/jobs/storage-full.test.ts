import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync, statfsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createKey, waitJob } from '../support/keys';
import { heldEncryption } from '../support/held-upload';
import { startWorkers } from '../../workers/worker';
import { jobBlob } from '../../lib/jobs/job-records';

// A blob store on a small tmpfs of its own fills up for real; mounting one needs root (as CI runs).
const root = process.getuid?.() === 0;
const mountpoint = mkdtempSync(join(tmpdir(), 'kms-full-'));
let s: TestService;

beforeAll(async () => {
  if (!root) return;
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=8m', 'tmpfs', mountpoint]);
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
/**
 * What a failed job left in the store: its folder's files and any write still under way (the store's
 * temporary folder). Other jobs' completed outputs stay, as they do.
 */
const leftOver = (jobId: string) => () =>
  [jobBlob.dir(jobId), '.tmp/'].map((dir) => join(blobs(), dir)).flatMap((dir) => (existsSync(dir) ? filesUnder(dir) : []));

/** Fills the disk with a file of its own until at most `room` bytes are left; answers what makes room again. */
function fillDisk(room = 0): () => void {
  const filler = join(mountpoint, 'filler');
  const { bavail, bsize } = statfsSync(mountpoint);
  const count = room ? `count=${Math.floor((bavail * bsize - room) / 65536)}` : '';
  execFileSync('sh', ['-c', `dd if=/dev/zero of=${filler} bs=64k ${count} 2>/dev/null || true`]);
  return () => rmSync(filler, { force: true });
}

/** The job's failure as its row, its audit row and its `jobs.failed` event record it. */
async function failureOf(token: string, jobId: string) {
  const row = await s.c.db('jobs').where({ id: jobId }).first();
  const audits = await s.c.db('audit_logs').where({ status: 'failure' }).whereRaw("details->>'job_id' = ?", [jobId]).select('action', 'details');
  const events = (await s.api('GET', '/events/history?types=jobs.failed', { token })).body.items as { data: { job_id: string; code?: string } }[];
  return {
    state: row.state,
    code: row.error?.code,
    idempotency_key: row.idempotency_key,
    audits: audits.map((a) => [a.action, a.details.code]),
    events: events.filter((e) => e.data.job_id === jobId).map((e) => e.data.code),
  };
}

const storageFullFailure = {
  state: 'failed',
  code: 'storage_full',
  idempotency_key: null,
  audits: [['keys.encrypt', 'storage_full']],
  events: ['storage_full'],
};

/** A 507 answered once the job was recorded: the problem, when to come back, and the job it recorded. */
function expectStorageFull(res: { status: number; headers: Headers; body: Record<string, unknown> }): string {
  expect([res.status, res.body.code], JSON.stringify(res.body)).toEqual([507, 'storage_full']);
  expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
  expect(res.headers.get('retry-after')).toBe('60');
  const jobId = res.body.job_id as string;
  expect(jobId).toMatch(/^[0-9a-f-]{36}$/);
  expect(res.body.status_url).toBe(`/api/v1/jobs/${jobId}`);
  return jobId;
}

describe.skipIf(!root)('a full blob store', () => {
  it('answers an upload that does not fit 507 storage_full with its job failed as such, keeps nothing of it and frees its Idempotency-Key', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const form = { fingerprint: key.fingerprint, files: [{ name: 'big.bin', data: randomBytes(1 << 20) }] };
    const headers = { 'idempotency-key': `full-${randomBytes(4).toString('hex')}` };
    // No worker runs: it is the upload itself that does not fit.
    const makeRoom = fillDisk(256 << 10);
    let jobId: string;
    try {
      jobId = expectStorageFull(await s.api('POST', '/keys/encrypt', { token: u.token, headers, form }));
      expect(await failureOf(u.token, jobId)).toEqual(storageFullFailure);
      await expect.poll(leftOver(jobId), { timeout: 10_000 }).toEqual([]);
    } finally {
      makeRoom();
    }
    // The same request with the same key, once there is room, runs anew.
    const retry = await s.api('POST', '/keys/encrypt', { token: u.token, headers, form });
    expect(retry.status, JSON.stringify(retry.body)).toBe(202);
    expect(retry.body.job_id).not.toBe(jobId);
    const pool = await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
    try {
      expect((await waitJob(s.api, u.token, retry.body.job_id)).state).toBe('completed');
    } finally {
      await pool.close();
    }
  });

  it('answers an upload whose job had no room for its output while the files arrived 507 storage_full, and frees its Idempotency-Key', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const data = randomBytes((1 << 20) + 1024);
    const headers = { 'idempotency-key': `full-${randomBytes(4).toString('hex')}` };
    // The upload stops after its first MiB, which the store keeps; then the disk fills up, and only then
    // does a worker take the job: its output, not the upload, is what does not fit.
    const held = heldEncryption(s.url, u.token, key.fingerprint, data, headers);
    await held.started;
    const job = await vi.waitUntil(() => s.c.db('jobs').where({ user_id: u.id, kind: 'encrypt' }).first(), { timeout: 10_000 });
    // Its bytes, in writes under way (the store's temporary folder) or published segments.
    const stored = () =>
      [join(blobs(), '.tmp'), join(blobs(), jobBlob.inputs(job.id))]
        .flatMap((dir) => (existsSync(dir) ? filesUnder(dir) : []))
        .reduce((n, f) => n + statSync(f).size, 0);
    await expect.poll(stored, { timeout: 10_000 }).toBeGreaterThan(1 << 20);
    const makeRoom = fillDisk();
    let jobId: string;
    const pool = await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
    try {
      try {
        jobId = expectStorageFull(await held.answer);
        expect(jobId).toBe(job.id);
      } finally {
        held.release();
      }
      const row = await s.c.db('jobs').where({ id: jobId }).first();
      expect([row.attempts, row.uploaded_at], 'the worker ran the job while its upload arrived').toEqual([1, null]);
      expect(await failureOf(u.token, jobId)).toEqual(storageFullFailure);
      await expect.poll(leftOver(jobId), { timeout: 10_000 }).toEqual([]);
      makeRoom();
      const retry = await s.api('POST', '/keys/encrypt', {
        token: u.token,
        headers,
        form: { fingerprint: key.fingerprint, files: [{ name: 'held.bin', data }] },
      });
      expect(retry.status, JSON.stringify(retry.body)).toBe(202);
      expect(retry.body.job_id).not.toBe(jobId);
      expect((await waitJob(s.api, u.token, retry.body.job_id)).state).toBe('completed');
    } finally {
      makeRoom();
      await pool.close();
    }
  });

  it('fails a job whose output does not fit at once with storage_full (no retries), deletes what it wrote and frees its Idempotency-Key', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const form = { fingerprint: key.fingerprint, files: [{ name: 'a.bin', data: randomBytes(1 << 20) }] };
    const headers = { 'idempotency-key': `full-${randomBytes(4).toString('hex')}` };
    const res = await s.api('POST', '/keys/encrypt', { token: u.token, headers, form });
    expect(res.status).toBe(202);
    // The upload is stored; now the disk fills up before a worker takes the job.
    const makeRoom = fillDisk();
    try {
      const pool = await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
      try {
        const job = await waitJob(s.api, u.token, res.body.job_id);
        expect([job.state, job.error?.code]).toEqual(['failed', 'storage_full']);
        expect((await s.c.db('jobs').where({ id: res.body.job_id }).first()).attempts).toBe(1);
        expect(await failureOf(u.token, res.body.job_id)).toEqual(storageFullFailure);
      } finally {
        await pool.close();
      }
    } finally {
      makeRoom();
    }
    await expect.poll(leftOver(res.body.job_id), { timeout: 10_000 }).toEqual([]);
    // The failure was the store's, not the request's: the same request with the same key runs anew.
    const retry = await s.api('POST', '/keys/encrypt', { token: u.token, headers, form });
    expect(retry.status, JSON.stringify(retry.body)).toBe(202);
    expect(retry.body.job_id).not.toBe(res.body.job_id);
    const pool = await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
    try {
      expect((await waitJob(s.api, u.token, retry.body.job_id)).state).toBe('completed');
    } finally {
      await pool.close();
    }
  });
});
