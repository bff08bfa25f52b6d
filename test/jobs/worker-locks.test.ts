import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { mkdtemp, open, rm } from 'node:fs/promises';
import { openAsBlob } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, waitJob } from '../support/keys';
import { startProcess, waitForOutput } from '../support/process';
import { startWorkers } from '../../workers/worker';

/**
 * Crash recovery with the default lock settings (a SIGKILLed worker's job is taken again within 35 s),
 * and no false stall: a worker busy on a CPU-bound 1 GiB job keeps renewing its lock, even when the
 * lock is short, so the job runs exactly once.
 */
let s: TestService;
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kms-locks-'));
  s = await startTestService({ roles: ['web'] });
});
afterAll(async () => {
  await s?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('a worker killed mid-job', () => {
  it('loses its job to another worker within 35 s (default WORKER_LOCK_MS and WORKER_STALLED_CHECK_MS)', async () => {
    const env = { ...s.env, LOG_LEVEL: 'info', WORKER_QUEUES: 'crypto=1' };
    delete (env as Record<string, string | undefined>).WORKER_LOCK_MS;
    delete (env as Record<string, string | undefined>).WORKER_STALLED_CHECK_MS;
    const first = startProcess('worker', env);
    let second: ReturnType<typeof startProcess> | undefined;
    try {
      await waitForOutput(first, 'workers started');
      const u = await registerUser(s.api);
      // RSA-4096 generation keeps the job active for long enough to kill the worker in the middle.
      const gen = await s.api('POST', '/keys/generate-key', {
        token: u.token,
        form: { label: 'k', name: 'K', email: 'k@example.test', passphrase: PASSPHRASE, algorithm: 'rsa4096' },
      });
      expect(gen.status).toBe(202);
      await expect.poll(async () => (await s.c.db('jobs').where({ id: gen.body.job_id }).first()).state, { timeout: 10_000, interval: 10 }).toBe('active');
      first.kill('SIGKILL');
      await first.exited;
      const killedAt = Date.now();
      second = startProcess('worker', env);
      await expect
        .poll(async () => (await s.c.db('jobs').where({ id: gen.body.job_id }).first()).attempts, { timeout: 40_000, interval: 100 })
        .toBeGreaterThanOrEqual(2);
      expect(Date.now() - killedAt).toBeLessThanOrEqual(35_000);
      const job = await waitJob(s.api, u.token, gen.body.job_id);
      expect(job.state, second.output()).toBe('completed');
      // The row commits before BullMQ hears the job ended: killing the worker in between would leave the
      // job active in Redis, for the next test's workers to find stalled.
      await expect
        .poll(
          async () => {
            const queued = await s.c.jobs.queue('crypto').getJob(gen.body.job_id);
            return !queued || (await queued.getState()) !== 'active';
          },
          { timeout: 10_000, interval: 50 },
        )
        .toBe(true);
    } finally {
      first.kill('SIGKILL');
      second?.kill('SIGKILL');
    }
  }, 90_000);
});

describe('a worker busy on a CPU-bound 1 GiB job', () => {
  it('keeps its lock (short lock, stall checks every second, a second worker waiting): no false stall, one run', async () => {
    const path = join(dir, 'big.bin');
    const file = await open(path, 'w');
    const block = randomBytes(1 << 20);
    for (let i = 0; i < 1024; i++) await file.write(block);
    await file.close();

    const env = { ...s.env, LOG_LEVEL: 'info', WORKER_QUEUES: 'crypto=1', WORKER_LOCK_MS: '2000', WORKER_STALLED_CHECK_MS: '1000' };
    const workers = [startProcess('worker', env), startProcess('worker', env)];
    try {
      await Promise.all(workers.map((w) => waitForOutput(w, 'workers started')));
      const u = await registerUser(s.api);
      const key = await createKey(s.api, u.token);
      const form = new FormData();
      form.append('fingerprint', key.fingerprint);
      form.append('files', await openAsBlob(path), 'big.bin');
      const res = await s.api('POST', '/keys/encrypt', { token: u.token, raw: form });
      expect(res.status, JSON.stringify(res.body)).toBe(202);
      const job = await waitJob(s.api, u.token, res.body.job_id);
      expect(job.state, JSON.stringify(job.error)).toBe('completed');
      expect(job.result.files[0].size).toBeGreaterThan(1 << 30);
      const row = await s.c.db('jobs').where({ id: res.body.job_id }).first();
      expect(row.attempts).toBe(1);
      expect(await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.encrypt' })).toHaveLength(1);
      for (const w of workers)
        expect(
          w
            .output()
            .split('\n')
            .filter((line) => line.includes(res.body.job_id)),
        ).not.toContainEqual(expect.stringMatching(/stalled/i));
    } finally {
      for (const w of workers) w.kill('SIGKILL');
    }
  }, 180_000);
});

describe('graceful shutdown', () => {
  it('never waits on a stuck job past WORKER_SHUTDOWN_GRACE_SECONDS: the job goes back to the queue and runs later', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    // A store whose reads never answer: the job is stuck (short of its own no-progress limit).
    const blob = s.c.blob;
    // The worker reads its inputs with `follow` (they may still be arriving).
    const follow = blob.follow.bind(blob);
    blob.follow = () => new Promise(() => undefined);
    const config = { ...s.c.config, workerLocks: { ...s.c.config.workerLocks, shutdownGraceMs: 1000 } };
    const pool = await startWorkers({ ...s.c, config }, [{ queue: 'crypto', concurrency: 1 }]);
    let closed = false;
    try {
      const res = await s.api('POST', '/keys/encrypt', {
        token: u.token,
        form: { fingerprint: key.fingerprint, files: [{ name: 'a.bin', data: randomBytes(100) }] },
      });
      await expect.poll(async () => (await s.c.db('jobs').where({ id: res.body.job_id }).first()).state, { timeout: 10_000, interval: 20 }).toBe('active');
      const started = Date.now();
      await pool.close();
      closed = true;
      expect(Date.now() - started).toBeLessThan(10_000);
      expect((await s.c.db('jobs').where({ id: res.body.job_id }).first()).state).toBe('queued');

      blob.follow = follow;
      const again = await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
      try {
        expect((await waitJob(s.api, u.token, res.body.job_id)).state).toBe('completed');
      } finally {
        await again.close();
      }
    } finally {
      blob.follow = follow;
      if (!closed) await pool.close();
    }
  }, 60_000);
});
