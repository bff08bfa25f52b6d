import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createKey, waitJob } from '../support/keys';
import { startProxy } from '../support/proxy';
import { startWorkers, type WorkerPool } from '../../workers/worker';

let s: TestService;
let pgProxy: Awaited<ReturnType<typeof startProxy>>;
let workers: WorkerPool | undefined;

beforeAll(async () => {
  const pg = new URL(inject('pgBase'));
  pgProxy = await startProxy(pg.hostname, Number(pg.port || 5432));
  // No worker yet: the test starts one once Postgres is out of reach.
  s = await startTestService({ roles: ['web'], dbHost: `127.0.0.1:${pgProxy.port}` });
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
});
