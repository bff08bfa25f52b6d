import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, waitJob } from '../support/keys';
import { startProcess, waitForOutput } from '../support/process';

/** Rotation under crashes and concurrency, with workers and schedulers as separate processes. */
let s: TestService;
const fast = { WORKER_LOCK_MS: '2000', WORKER_STALLED_CHECK_MS: '1000', LOG_LEVEL: 'info' };

beforeAll(async () => {
  s = await startTestService({ roles: ['web'] });
});
afterAll(async () => {
  await s?.stop();
});

/** The rotation job completed (on `worker`), and made exactly one new generation. */
async function expectRotatedOnce(token: string, jobId: string, lineageId: string, worker: { output: () => string }) {
  const job = await waitJob(s.api, token, jobId);
  expect(job.state, worker.output()).toBe('completed');
  const after = await s.c.db('pgp_keys').where({ lineage_id: lineageId }).orderBy('generation');
  expect(after.map((k: { generation: number; status: string }) => [k.generation, k.status])).toEqual([
    [1, 'rotated'],
    [2, 'active'],
  ]);
  expect(await s.c.db('rotation_history').where({ lineage_id: lineageId })).toHaveLength(1);
  expect(job.result.new_fingerprint).toBe(after[1].fingerprint);
}

describe('a worker killed mid-rotation', () => {
  it('leaves the old state or the new one, never half, and another worker finishes the job', async () => {
    let worker = startProcess('worker', { ...s.env, ...fast, WORKER_QUEUES: 'crypto=1,rotation=1' });
    try {
      await waitForOutput(worker, 'workers started');
      const u = await registerUser(s.api);
      // RSA-4096: generating the next generation takes long enough to kill the worker in the middle.
      const gen = await s.api('POST', '/keys/generate-key', {
        token: u.token,
        form: { label: 'crash', name: 'C', email: 'c@example.test', passphrase: PASSPHRASE, algorithm: 'rsa4096' },
      });
      const made = await waitJob(s.api, u.token, gen.body.job_id);
      expect(made.state).toBe('completed');
      const fingerprint = made.result.key.fingerprint as string;
      const lineageId = made.result.key.lineage_id as string;

      const rotate = await s.api('POST', `/keys/${fingerprint}/rotate`, { token: u.token, body: {} });
      expect(rotate.status).toBe(202);
      await expect
        .poll(async () => (await s.api('GET', `/jobs/${rotate.body.job_id}`, { token: u.token })).body.state, { timeout: 10_000, interval: 10 })
        .toBe('active');
      worker.kill('SIGKILL');
      await worker.exited;

      const keys = await s.c.db('pgp_keys').where({ lineage_id: lineageId });
      const entries = await s.c.db('rotation_history').where({ lineage_id: lineageId, status: 'succeeded' });
      expect(keys.filter((k: { status: string }) => k.status === 'active')).toHaveLength(1);
      expect(keys).toHaveLength(entries.length + 1); // generation 1 alone, or generations 1 and 2 with their history row

      worker = startProcess('worker', { ...s.env, ...fast, WORKER_QUEUES: 'rotation=1' });
      await expectRotatedOnce(u.token, rotate.body.job_id, lineageId, worker);
    } finally {
      worker.kill('SIGKILL');
    }
  }, 120_000);
});

describe('a worker frozen inside its rotation transaction', () => {
  it('loses its session after DB_IDLE_IN_TRANSACTION_SECONDS, and another worker finishes the rotation', async () => {
    // A process that stops (here SIGSTOP; a deadlock or a paused host does the same) keeps its transaction
    // open: without the limit, the worker that takes the job over would wait on its row locks for good.
    const env = { ...s.env, ...fast, DB_IDLE_IN_TRANSACTION_SECONDS: '1', WORKER_QUEUES: 'crypto=1,rotation=1' };
    const frozen = startProcess('worker', env);
    let other: ReturnType<typeof startProcess> | undefined;
    const hold = await s.c.db.transaction();
    try {
      await waitForOutput(frozen, 'workers started');
      const u = await registerUser(s.api);
      const gen = await s.api('POST', '/keys/generate-key', {
        token: u.token,
        form: { label: 'frozen', name: 'F', email: 'f@example.test', passphrase: PASSPHRASE, algorithm: 'rsa4096' },
      });
      const made = await waitJob(s.api, u.token, gen.body.job_id);
      const lineageId = made.result.key.lineage_id as string;

      const rotate = await s.api('POST', `/keys/${made.result.key.fingerprint}/rotate`, { token: u.token, body: {} });
      expect(rotate.status).toBe(202);
      const jobId = rotate.body.job_id as string;
      await expect.poll(async () => (await s.api('GET', `/jobs/${jobId}`, { token: u.token })).body.state, { timeout: 10_000, interval: 10 }).toBe('active');
      // Hold the job's row while the worker makes the new RSA key: its switch then waits inside the
      // transaction, at the job row's update, with the lineage's rows already locked.
      await hold('jobs').where({ id: jobId }).forUpdate();
      // The worker's session waits on the job row, inside the transaction that has already written the keys.
      const waiting = async () =>
        (
          await s.c.db.raw(
            `SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query ILIKE '%update "jobs"%'
               AND pid IN (SELECT pid FROM pg_locks WHERE relation = 'pgp_keys'::regclass AND mode = 'RowExclusiveLock' AND granted)`,
          )
        ).rows[0].n;
      await expect.poll(waiting, { timeout: 60_000, interval: 20 }).toBe(1);
      frozen.kill('SIGSTOP');
      await hold.rollback(); // the update goes through on the server; the frozen process never commits

      other = startProcess('worker', env);
      await expectRotatedOnce(u.token, jobId, lineageId, other);
    } finally {
      if (!hold.isCompleted()) await hold.rollback();
      frozen.kill('SIGKILL');
      other?.kill('SIGKILL');
    }
  }, 120_000);
});

describe('several scheduler processes', () => {
  it('register one job scheduler per sweep, whatever their number', async () => {
    const schedulers = [1, 2].map(() => startProcess('scheduler', { ...s.env, LOG_LEVEL: 'info' }));
    try {
      await Promise.all(schedulers.map((p) => waitForOutput(p, 'scheduler started')));
      const rotation = await s.c.jobs.queue('rotation').getJobSchedulers();
      expect(rotation.map((j) => j.key)).toEqual(['rotation-sweep']);
      const maintenance = await s.c.jobs.queue('maintenance').getJobSchedulers();
      expect(maintenance.map((j) => j.key).sort()).toEqual([
        'audit-checkpoint',
        'destruction-sweep',
        'expiry-sweep',
        'purge-expired',
        'purge-job-outputs',
        'reconcile-jobs',
        'sweep-blobs',
      ]);
    } finally {
      for (const p of schedulers) p.kill('SIGTERM');
      await Promise.all(schedulers.map((p) => p.exited));
    }
  }, 60_000);
});
