import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Readable } from 'node:stream';
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
    // Uploads that ended while Postgres was out of reach, whose web process died before it recorded the
    // end: one kept the end beside its files, the other's kept end does not match the files it names.
    const ended = await keptEnd(u.token, key.fingerprint, 'ended-upload', (f) => f);
    const forged = await keptEnd(u.token, key.fingerprint, 'forged-upload', (f) => ({ ...f, size: f.size + 1 }));
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

    // The kept end is recorded (with the request's hash, so the same key answers with the job), then the job runs.
    const endedJob = await waitUntilFinished(u.token, ended.jobId);
    expect([endedJob.state, endedJob.error], JSON.stringify(endedJob)).toEqual(['completed', null]);
    expect((await row(ended.jobId)).request_hash).toBe(ended.hash);
    expect(await s.c.blob.stat(jobBlob.uploadEnd(ended.jobId))).toBeNull();
    const replay = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      headers: { 'idempotency-key': 'ended-upload' },
      form: { fingerprint: key.fingerprint, files: [{ name: 'e.bin', data: ended.data }] },
    });
    expect([replay.status, replay.body.job_id]).toEqual([202, ended.jobId]);
    const forgedJob = await waitUntilFinished(u.token, forged.jobId);
    expect([forgedJob.state, forgedJob.error?.code]).toEqual(['failed', 'job_lost']);

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

/**
 * An encryption whose row is put back to "upload not ended" (as when its end could not be recorded), its
 * end kept beside its files as its API process keeps it, each file's entry passed through `alter`.
 */
async function keptEnd(token: string, fingerprint: string, idempotencyKey: string, alter: (f: { n: number; size: number }) => { n: number; size: number }) {
  const data = randomBytes(3000);
  const res = await s.api('POST', '/keys/encrypt', {
    token,
    headers: { 'idempotency-key': idempotencyKey },
    form: { fingerprint, files: [{ name: 'e.bin', data }] },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(202);
  const jobId = res.body.job_id as string;
  const { request_hash: hash } = await row(jobId);
  await s.c.db('jobs').where({ id: jobId }).update({ uploaded_at: null, request_hash: null });
  const record = { job_id: jobId, files: [alter({ n: 0, size: data.length })], request_hash: hash };
  await s.c.blob.put(jobBlob.uploadEnd(jobId), Readable.from([Buffer.from(JSON.stringify(record))]));
  return { jobId, hash: hash as string, data };
}

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
