import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { registerUser, startTestService, type TestService } from '../support/service';
import { startRedisServer } from '../support/redis-server';
import { createKey, download, PASSPHRASE, runJob, waitJob } from '../support/keys';
import { startWorkers, type WorkerPool } from '../../workers/worker';
import { startScheduler, type Scheduler } from '../../workers/scheduler';
import { jobBlob } from '../../lib/jobs/job-records';

let redis: Awaited<ReturnType<typeof startRedisServer>>;
let s: TestService;
let pool: WorkerPool | undefined;
let scheduler: Scheduler | undefined;

beforeAll(async () => {
  redis = await startRedisServer();
  // No workers yet: the jobs stay queued until Redis has lost them.
  s = await startTestService({ roles: ['web'], env: { REDIS_URL: redis.url, JOB_RECONCILE_INTERVAL_SECONDS: '1', JOB_RECONCILE_GRACE_SECONDS: '1' } });
});
afterAll(async () => {
  await scheduler?.close();
  await pool?.close();
  await s?.stop();
  await redis?.stop();
});

const row = (id: string) => s.c.db('jobs').where({ id }).first();

describe('jobs whose queue entry Redis lost', () => {
  it('are enqueued again and complete once when their inputs are stored, else fail with job_lost and leave nothing', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const plain = randomBytes(200_000);
    const kept = await s.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files: [{ name: 'a.bin', data: plain }] } });
    expect(kept.status, JSON.stringify(kept.body)).toBe(202);
    const broken = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      headers: { 'idempotency-key': 'broken-upload' },
      form: { fingerprint: key.fingerprint, files: [{ name: 'b.bin', data: randomBytes(1000) }] },
    });
    expect(broken.status, JSON.stringify(broken.body)).toBe(202);
    // An upload whose web process died before it ended: its row never got `uploaded_at`.
    await s.c.db('jobs').where({ id: broken.body.job_id }).update({ uploaded_at: null });
    expect(await s.c.blob.stat(jobBlob.input(broken.body.job_id, 0))).not.toBeNull();
    // A job whose queue payload carries a secret that is never stored (the new key's sealed lock).
    const rsa = await s.api('POST', '/keys/generate-key', {
      token: u.token,
      form: { label: 'rsa', environment: 'production', name: 'Ann Example', email: 'ann@example.test', passphrase: PASSPHRASE, algorithm: 'rsa3072' },
    });
    expect(rsa.status, JSON.stringify(rsa.body)).toBe(202);

    await redis.stop();
    await redis.start();
    await expect.poll(() => s.c.redis.status, { timeout: 10_000 }).toBe('ready');
    expect(await s.c.jobs.queue('crypto').getJob(kept.body.job_id)).toBeUndefined();
    await sleep(1100); // past the grace period

    pool = await startWorkers(s.c, [
      { queue: 'crypto', concurrency: 1 },
      { queue: 'maintenance', concurrency: 1 },
    ]);
    scheduler = await startScheduler(s.c);

    const done = await waitUntilFinished(u.token, kept.body.job_id);
    expect([done.state, done.error], JSON.stringify(done)).toEqual(['completed', null]);
    expect((await row(kept.body.job_id)).attempts).toBe(1);
    const ciphertext = await download(s.api, u.token, kept.body.job_id);
    const decrypted = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'a.bin.gpg', data: ciphertext }],
    });
    expect(decrypted.state, JSON.stringify(decrypted.error)).toBe('completed');
    expect((await download(s.api, u.token, decrypted.job_id)).equals(plain)).toBe(true);

    for (const lost of [broken.body.job_id, rsa.body.job_id]) {
      const job = await waitUntilFinished(u.token, lost);
      expect([job.state, job.error?.code]).toEqual(['failed', 'job_lost']);
      expect(job.error?.message).toMatch(/submit it again/i);
    }
    expect(await s.c.blob.stat(jobBlob.input(broken.body.job_id, 0))).toBeNull();
    const events = (await s.api('GET', '/events/history?types=jobs.failed', { token: u.token })).body.items as { data: { job_id: string; code?: string } }[];
    const failed = events.map((e) => [e.data.job_id, e.data.code]);
    expect(failed).toEqual(
      expect.arrayContaining([
        [broken.body.job_id, 'job_lost'],
        [rsa.body.job_id, 'job_lost'],
      ]),
    );
    // Nothing of the lost request was done: the client's retry with its Idempotency-Key runs it anew.
    const retry = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      headers: { 'idempotency-key': 'broken-upload' },
      form: { fingerprint: key.fingerprint, files: [{ name: 'b.bin', data: randomBytes(1000) }] },
    });
    expect(retry.status, JSON.stringify(retry.body)).toBe(202);
    expect(retry.body.job_id).not.toBe(broken.body.job_id);
    expect((await waitJob(s.api, u.token, retry.body.job_id)).state).toBe('completed');
  });
});

/** The job once it has ended; a job the reconciler never sees stays queued and times the test out. */
async function waitUntilFinished(token: string, jobId: string) {
  let job: { state: string; error: { code: string; message: string } | null } | undefined;
  await expect
    .poll(
      async () => {
        job = (await s.api('GET', `/jobs/${jobId}`, { token })).body;
        return job!.state;
      },
      { timeout: 20_000, interval: 250 },
    )
    .toMatch(/^(completed|failed)$/);
  return job! as { state: string; error: { code: string; message: string } | null } & Record<string, any>;
}
