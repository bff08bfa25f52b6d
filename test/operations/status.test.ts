import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { startProcess, waitForOutput } from '../support/process';

/** GET /status: admin only; dependencies, queues, schedules and the live worker processes. */
let s: TestService;
beforeAll(async () => {
  s = await startTestService({ roles: ['web', 'worker', 'scheduler'] });
});
afterAll(async () => {
  await s?.stop();
});

async function admin() {
  const u = await registerUser(s.api);
  await s.c.db('users').where({ id: u.id }).update({ role: 'admin' }); // as `npm run admin -- grant` does
  return u;
}

describe('GET /status', () => {
  it('is for administrators only: 401 without credentials, 403 for others (audited)', async () => {
    expect((await s.api('GET', '/status')).status).toBe(401);
    const u = await registerUser(s.api);
    const res = await s.api('GET', '/status', { token: u.token });
    expect(res.status).toBe(403);
    expect(await s.c.db('audit_logs').where({ user_id: u.id, action: 'sessions.deny' })).toHaveLength(1);
  });

  it('shows dependencies, queue counts, schedules, and a second worker process within seconds of its start, gone after it is killed', async () => {
    const a = await admin();
    const first = await s.api('GET', '/status', { token: a.token });
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({ version: expect.any(String), postgres: { state: 'up' }, redis: { state: 'up' } });
    const maintenance = first.body.queues.find((q: { queue: string }) => q.queue === 'maintenance');
    expect(maintenance.schedulers.map((x: { scheduler_id: string }) => x.scheduler_id)).toContain('purge-job-outputs');
    expect(maintenance.schedulers[0].next_run_at).toBeTruthy();
    const before = first.body.workers.length;
    expect(before).toBeGreaterThanOrEqual(1);
    // Every process, with the data key it seals under: this one runs the API, the workers and the scheduler.
    expect(first.body.master_key.processes).toContainEqual({
      process_id: expect.any(String),
      host: expect.any(String),
      pid: process.pid,
      roles: ['web', 'worker', 'scheduler'],
      current_kid: first.body.master_key.current_kid,
      reload_error: null,
      behind: false,
    });

    const worker = startProcess('worker', { ...s.env, LOG_LEVEL: 'info', WORKER_QUEUES: 'crypto=3' });
    try {
      await waitForOutput(worker, 'workers started');
      await expect
        .poll(async () => (await s.api('GET', '/status', { token: a.token })).body.workers.length, { timeout: 10_000, interval: 200 })
        .toBe(before + 1);
      const status = (await s.api('GET', '/status', { token: a.token })).body;
      const crypto = status.queues.find((q: { queue: string }) => q.queue === 'crypto');
      expect(crypto.concurrency).toBeGreaterThanOrEqual(3);
      expect(status.master_key.processes).toContainEqual(expect.objectContaining({ pid: worker.pid, roles: ['worker'], behind: false }));
    } finally {
      worker.kill('SIGKILL');
      await worker.exited;
    }
    // A killed process stops beating and drops out when its key expires.
    await expect.poll(async () => (await s.api('GET', '/status', { token: a.token })).body.workers.length, { timeout: 25_000, interval: 500 }).toBe(before);
  }, 60_000);
});
