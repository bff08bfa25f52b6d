import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createHash, randomBytes } from 'node:crypto';
import { PASSPHRASE, createKey, download, waitJob } from '../support/keys';
import { heldEncryption } from '../support/held-upload';
import { startProxy } from '../support/proxy';
import { jobBlob } from '../../lib/jobs/job-records';
import { startWorkers, type WorkerPool } from '../../workers/worker';
import { startProcess, waitForOutput } from '../support/process';
import { freePort } from '../support/ports';

let s: TestService;
let pgProxy: Awaited<ReturnType<typeof startProxy>>;
let workers: WorkerPool | undefined;

beforeAll(async () => {
  const pg = new URL(inject('pgBase'));
  pgProxy = await startProxy(pg.hostname, Number(pg.port || 5432));
  // No worker yet: the test starts one once Postgres is out of reach. An upload's end is recorded again
  // for 5 s (UPLOAD_END_RETRY_SECONDS) before it is answered 503.
  s = await startTestService({ roles: ['web'], env: { UPLOAD_END_RETRY_SECONDS: '5' }, dbHost: `127.0.0.1:${pgProxy.port}` });
});
afterAll(async () => {
  pgProxy?.restore();
  await workers?.close();
  await s?.stop();
  await pgProxy?.close();
});

describe('Postgres out of reach while a job waits to run', () => {
  it('spends none of its attempts: the job runs once Postgres is back, and completes', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const res = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, files: [{ name: 'a.txt', data: Buffer.from('hello') }] },
    });
    expect(res.status).toBe(202);
    const jobId = res.body.job_id as string;

    pgProxy.cut();
    workers = await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
    // Longer than its three attempts' back-off (2 s, 4 s) would take to spend them all.
    await new Promise((r) => setTimeout(r, 9000));
    const queued = await s.c.jobs.queue('crypto').getJob(jobId);
    expect(queued?.attemptsMade).toBe(0);
    expect(await queued?.getState()).not.toBe('failed');

    pgProxy.restore();
    const job = await waitJob(s.api, u.token, jobId);
    expect([job.state, job.error]).toEqual(['completed', null]);
  }, 60_000);

  it('keeps an upload that ends while Postgres is out of reach: its job completes, and the same key meanwhile is told when to retry', async () => {
    workers ??= await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const data = randomBytes(3 << 20);
    const idem = `held-${randomBytes(4).toString('hex')}`;
    const held = heldEncryption(s.url, u.token, key.fingerprint, data, { 'idempotency-key': idem });
    await held.started;
    await uploadingJob(u.id);
    // The same key while the first request still uploads: 409, and when to ask again.
    const inUse = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      headers: { 'idempotency-key': idem },
      form: { fingerprint: key.fingerprint, files: [{ name: 'held.bin', data }] },
    });
    expect([inUse.status, inUse.body.code]).toEqual([409, 'idempotency_key_in_use']);
    expect(Number(inUse.headers.get('retry-after'))).toBeGreaterThan(0);

    pgProxy.cut();
    held.release(); // the upload arrives whole while Postgres is out of reach
    await new Promise((r) => setTimeout(r, 3000));
    pgProxy.restore();
    const answer = await held.answer;
    expect(answer.status, JSON.stringify(answer.body)).toBe(202);
    // The end kept in the blob store while Postgres was out of reach goes once it is recorded.
    expect(await s.c.blob.stat(jobBlob.uploadEnd(answer.body.job_id as string))).toBeNull();
    await expectKeptJob(u, key, answer.body.job_id as string, data, idem);
  }, 90_000);

  it('keeps an upload that ends in an outage longer than its end is recorded again: answered 503 with its job, which completes once Postgres is back', async () => {
    workers ??= await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
    await uploadThroughLongOutage(s.url);
  }, 90_000);

  it('keeps it when the API process that answered 503 is killed too: the worker records the end its process kept', async () => {
    workers ??= await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
    const port = await freePort();
    const web = startProcess('web', { ...s.env, PORT: String(port), LOG_LEVEL: 'info', UPLOAD_END_RETRY_SECONDS: '1' });
    try {
      await waitForOutput(web, 'The service is ready', 60_000);
      await uploadThroughLongOutage(`http://127.0.0.1:${port}/api/v1`, async () => {
        web.kill('SIGKILL');
        await web.exited;
      });
    } finally {
      web.kill('SIGKILL');
    }
  }, 120_000);
});

/**
 * The id of the user's one encryption job once its upload has begun: the job exists and its first input
 * is recorded (what an outage from then on must not lose; an outage before that fails the upload).
 */
async function uploadingJob(userId: string): Promise<string> {
  const inputOf = async () =>
    s.c
      .db('jobs')
      .join('job_files', 'job_files.job_id', 'jobs.id')
      .where({ 'jobs.user_id': userId, 'jobs.kind': 'encrypt', 'job_files.role': 'input' })
      .pluck('jobs.id');
  await expect.poll(async () => (await inputOf()).length, { timeout: 10_000 }).toBe(1);
  const [jobId] = await inputOf();
  return jobId;
}

/**
 * An encryption with an Idempotency-Key sent to the API at `base`, whose upload ends while Postgres is
 * out of reach for longer than the API records its end again: the answer is 503 with the job, `after503`
 * runs, and once Postgres is back the job completes, decrypts to what was sent, and is the one job the
 * same key answers with.
 */
async function uploadThroughLongOutage(base: string, after503?: () => Promise<void>) {
  const u = await registerUser(s.api);
  const key = await createKey(s.api, u.token);
  const data = randomBytes(3 << 20);
  const idem = `long-${randomBytes(4).toString('hex')}`;
  const held = heldEncryption(base, u.token, key.fingerprint, data, { 'idempotency-key': idem });
  await held.started;
  const jobId = await uploadingJob(u.id);

  pgProxy.cut();
  let answer: Awaited<typeof held.answer>;
  try {
    held.release();
    answer = await held.answer;
    expect([answer.status, answer.body.code], JSON.stringify(answer.body)).toEqual([503, 'database_unavailable']);
    expect(answer.body).toMatchObject({ job_id: jobId, status_url: `/api/v1/jobs/${jobId}` });
    await after503?.();
    // The outage goes on after the answer: the end waits in the blob store.
    await new Promise((r) => setTimeout(r, 3000));
  } finally {
    pgProxy.restore();
  }
  await expectKeptJob(u, key, jobId, data, idem);
  expect(await s.c.db('jobs').where({ user_id: u.id, kind: 'encrypt' }).pluck('id')).toEqual([jobId]);
  // The kept end is gone once recorded.
  expect(await s.c.blob.stat(jobBlob.uploadEnd(jobId))).toBeNull();
}

/**
 * The job of an upload kept through an outage: completed, its output the upload's encryption, whole
 * (it decrypts to what was sent), and the one job the same Idempotency-Key answers with.
 */
async function expectKeptJob(u: { token: string }, key: { fingerprint: string }, jobId: string, data: Buffer, idem: string) {
  const job = await waitJob(s.api, u.token, jobId);
  expect([job.state, job.error]).toEqual(['completed', null]);
  const dec = await s.api('POST', '/keys/decrypt', {
    token: u.token,
    form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'held.bin.gpg', data: await download(s.api, u.token, jobId) }] },
  });
  expect(dec.status, JSON.stringify(dec.body)).toBe(202);
  expect((await waitJob(s.api, u.token, dec.body.job_id)).state).toBe('completed');
  const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
  expect(sha(await download(s.api, u.token, dec.body.job_id))).toBe(sha(data));
  const again = await s.api('POST', '/keys/encrypt', {
    token: u.token,
    headers: { 'idempotency-key': idem },
    form: { fingerprint: key.fingerprint, files: [{ name: 'held.bin', data }] },
  });
  expect([again.status, again.body.job_id]).toEqual([202, jobId]);
}
