import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Job } from 'bullmq';
import { registerUser, startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { createKey } from '../support/keys';
import { captureLogs } from '../support/logs';
import { reconcileJobsProcessor } from '../../workers/jobs/reconcile-jobs';
import { NO_POOL } from '../../lib/slots';
import { Watchdog } from '../../workers/watchdog';
import type { JobEnvelope } from '../../jobs/define';

/**
 * The reconciler's records run under its own queue entry's logger, which carries that entry's `job_id`
 * (workers/worker.ts): the job a record is about must not be a second `job_id` key in the same record.
 */
let s: TestService;

// No rotation worker: the rotation job stays queued until its entry is removed.
beforeAll(async () => (s = await startTestService({ env: { WORKER_QUEUES: 'crypto=1,notify=1' } })));
afterAll(async () => s?.stop());

describe("the reconciler's log records", () => {
  it('name the job they are about once, apart from the job_id of the reconciler’s own entry', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const rot = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {} });
    expect(rot.status, JSON.stringify(rot.body)).toBe(202);
    await (await s.c.jobs.queue('rotation').getJob(rot.body.job_id))?.remove();
    (s.c.clock as ManualClockFollowingTime).advance(s.config.jobReconcile.graceMs + 1000);

    const logs = captureLogs();
    const ctx = {
      c: s.c,
      job: {} as Job<JobEnvelope>,
      log: logs.logger().child({ job_id: 'the-reconciler-entry' }),
      origin: { request_id: null, ip: null },
      watchdog: new Watchdog({ timeoutMs: 10_000 }),
      slot: NO_POOL,
    };
    expect(await reconcileJobsProcessor.process({}, ctx)).toMatchObject({ lost: 1 });
    const line = logs
      .output()
      .split('\n')
      .find((l) => l.includes('job had lost its queue entry'));
    expect(line).toBeDefined();
    expect(line!.match(/"job_id":/g)).toHaveLength(1);
    expect(JSON.parse(line!)).toMatchObject({ job_id: 'the-reconciler-entry', reconciled_job_id: rot.body.job_id, code: 'job_lost' });
  }, 60_000);
});
