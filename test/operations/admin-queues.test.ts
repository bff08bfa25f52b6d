import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';

/** The console's queue view: `/api/v1/admin/queues…` on BullMQ's own API, with real workers running. */
let s: TestService;
beforeAll(async () => {
  s = await startTestService();
});
afterAll(async () => {
  await s?.stop();
});

async function admin() {
  const u = await registerUser(s.api);
  await s.c.db('users').where({ id: u.id }).update({ role: 'admin' }); // as `npm run admin -- grant` does
  return u;
}

/** A job no worker can do: the worker fails it for good, with its reason, on every run. */
async function failingJob(): Promise<string> {
  const job = await s.c.jobs.queue('maintenance').add('no-such-job', { payload: {}, meta: { enqueued_at: new Date().toISOString() } });
  return job.id!;
}

const jobOf = async (token: string, id: string) => {
  const res = await s.api('GET', '/admin/queues/maintenance/jobs?state=failed&limit=100', { token });
  expect(res.status).toBe(200);
  return (res.body.jobs as { job_id: string; attempts_made: number; failed_reason: string | null; finished_at: string | null }[]).find((j) => j.job_id === id);
};

describe('admin queue routes', () => {
  it('are for administrators: 401 without a session, 403 for a user (audited)', async () => {
    const u = await registerUser(s.api);
    expect((await s.api('GET', '/admin/queues')).status).toBe(401);
    const refused = await s.api('GET', '/admin/queues', { token: u.token });
    expect(refused.status).toBe(403);
    expect(refused.body).toMatchObject({ code: 'admin_required' });
    expect((await s.api('GET', '/admin/queues/crypto/jobs', { token: u.token })).status).toBe(403);
    expect((await s.api('POST', '/admin/queues/crypto/jobs/1/retry', { token: u.token })).status).toBe(403);
    const denied = await s.c.db('audit_logs').where({ user_id: u.id, status: 'failure' }).select('target');
    expect(denied.map((r: { target: string }) => r.target)).toContain('/admin/queues');
  });

  it('count every queue by state and list its jobs with why they failed', async () => {
    const a = await admin();
    const id = await failingJob();
    await expect.poll(async () => (await jobOf(a.token, id))?.failed_reason, { timeout: 15_000 }).toMatch(/no job "no-such-job" on queue "maintenance"/);
    const res = await s.api('GET', '/admin/queues', { token: a.token });
    expect(res.status).toBe(200);
    expect(res.body.queues.map((q: { queue: string }) => q.queue)).toEqual(['crypto', 'rotation', 'notify', 'billing', 'team-sync', 'maintenance']);
    const maintenance = res.body.queues.find((q: { queue: string }) => q.queue === 'maintenance');
    expect(maintenance).toMatchObject({ paused: false, counts: { failed: expect.any(Number), waiting: expect.any(Number) } });
    expect(maintenance.counts.failed).toBeGreaterThanOrEqual(1);
    // Without a state: every state, newest first; the job's data (sealed values) is not shown.
    const all = await s.api('GET', '/admin/queues/maintenance/jobs', { token: a.token });
    expect(all.body.jobs[0]).toEqual({
      job_id: id,
      name: 'no-such-job',
      state: 'failed',
      attempts_made: 1,
      failed_reason: expect.stringMatching(/no job/),
      created_at: expect.any(String),
      processed_at: expect.any(String),
      finished_at: expect.any(String),
    });
  });

  it('refuse malformed input with 422 naming the field, an unknown job with 404', async () => {
    const a = await admin();
    const bad = await s.api('GET', '/admin/queues/nope/jobs?state=gone&limit=0&extra=1', { token: a.token });
    expect(bad.status).toBe(422);
    expect(bad.body.errors.map((e: { path: string }) => e.path)).toEqual(['params.queue']);
    const query = await s.api('GET', '/admin/queues/crypto/jobs?state=gone&limit=0&extra=1', { token: a.token });
    expect(query.status).toBe(422);
    expect(query.body.errors.map((e: { path: string }) => e.path).sort()).toEqual(['query.extra', 'query.limit', 'query.state']);
    expect((await s.api('POST', '/admin/queues/crypto/jobs/a:b/retry', { token: a.token })).status).toBe(422);
    const missing = await s.api('POST', '/admin/queues/crypto/jobs/424242/retry', { token: a.token });
    expect(missing.status).toBe(404);
    expect(missing.body).toMatchObject({ code: 'job_not_found' });
  });

  it('retry a failed job: a worker really runs it again (its attempts count on), audited; a job not failed is 409', async () => {
    const a = await admin();
    const id = await failingJob();
    await expect.poll(async () => (await jobOf(a.token, id))?.attempts_made, { timeout: 15_000 }).toBe(1);
    const first = (await jobOf(a.token, id))!;
    const retried = await s.api('POST', `/admin/queues/maintenance/jobs/${id}/retry`, { token: a.token });
    expect(retried.status, JSON.stringify(retried.body)).toBe(202);
    expect(retried.body).toMatchObject({ job_id: id, name: 'no-such-job' });
    // The worker's second run: a second attempt, ended later than the first, with its reason again.
    await expect.poll(async () => (await jobOf(a.token, id))?.attempts_made, { timeout: 15_000 }).toBe(2);
    const second = (await jobOf(a.token, id))!;
    expect(Date.parse(second.finished_at!)).toBeGreaterThan(Date.parse(first.finished_at!));
    expect(second.failed_reason).toMatch(/no job/);
    const row = await s.c.db('audit_logs').where({ user_id: a.id, action: 'queue_jobs.retry' }).first();
    expect(row).toMatchObject({ status: 'success', target: `maintenance/${id}`, details: { name: 'no-such-job' } });

    // A job that has not failed is not retried; two retries at once re-run it once.
    const done = await s.c.jobs.queue('maintenance').add('no-such-job', { payload: {}, meta: { enqueued_at: new Date().toISOString() } }, { delay: 60_000 });
    const notFailed = await s.api('POST', `/admin/queues/maintenance/jobs/${done.id}/retry`, { token: a.token });
    expect(notFailed.status).toBe(409);
    expect(notFailed.body).toMatchObject({ code: 'job_not_failed', detail: expect.stringMatching(/delayed/) });
  });

  it('two retries of one failed job at once: one re-runs it, the other is refused', async () => {
    const a = await admin();
    const id = await failingJob();
    await expect.poll(async () => (await jobOf(a.token, id))?.attempts_made, { timeout: 15_000 }).toBe(1);
    const both = await Promise.all([1, 2].map(() => s.api('POST', `/admin/queues/maintenance/jobs/${id}/retry`, { token: a.token })));
    expect(both.map((r) => r.status).sort()).toEqual([202, 409]);
    await expect.poll(async () => (await jobOf(a.token, id))?.attempts_made, { timeout: 15_000 }).toBe(2);
  });
});
