import type { Container } from '../lib/container';
import type { Config } from '../lib/config';
import type { JobEnvelope } from '../jobs/define';
import { contractOf, type JobName } from '../jobs/contracts';

/**
 * Recurring work, registered as BullMQ job schedulers. Upserting is idempotent, so any number of
 * scheduler processes may run: Redis holds one scheduler per id, and each tick enqueues one job.
 */
const SCHEDULES: { id: string; job: JobName; every: number | ((config: Config) => number) }[] = [
  { id: 'purge-expired', job: 'purge-expired', every: 3600_000 },
  { id: 'purge-job-outputs', job: 'purge-job-outputs', every: 600_000 },
  { id: 'sweep-blobs', job: 'sweep-blobs', every: 3600_000 },
  { id: 'rotation-sweep', job: 'rotation-sweep', every: (config) => config.rotationSweepMs },
  { id: 'expiry-sweep', job: 'expiry-sweep', every: 3600_000 },
  { id: 'billing-sweep', job: 'billing-sweep', every: 300_000 },
  { id: 'destruction-sweep', job: 'destruction-sweep', every: 300_000 },
  { id: 'reconcile-jobs', job: 'reconcile-jobs', every: (config) => config.jobReconcile.intervalMs },
  { id: 'audit-checkpoint', job: 'audit-checkpoint', every: (config) => config.auditCheckpoints.intervalMs },
];

/** How late past its period a schedule's next run may be before it counts as lost (a busy worker starts it late). */
const LOST_ITERATION_SLACK_MS = 30_000;

export interface Scheduler {
  close: () => Promise<void>;
}

export async function startScheduler(c: Container): Promise<Scheduler> {
  const register = async () => {
    for (const s of SCHEDULES) {
      const def = contractOf(s.job)!;
      const data: JobEnvelope = { payload: {}, meta: { enqueued_at: new Date().toISOString() } };
      const every = typeof s.every === 'number' ? s.every : s.every(c.config);
      const queue = c.jobs.queue(def.queue);
      // A schedule whose next iteration is overdue by a whole period has lost it (a failover dropped the
      // delayed job that stood for it): upserting would keep the stale record, so it is made anew.
      const existing = await queue.getJobScheduler(s.id);
      if (existing?.next !== undefined && existing.next < Date.now() - every - LOST_ITERATION_SLACK_MS) {
        c.log.warn({ schedule: s.id, next: new Date(existing.next).toISOString() }, 'a schedule lost its next run: made anew');
        await queue.removeJobScheduler(s.id);
      }
      await queue.upsertJobScheduler(s.id, { every }, { name: def.name, data, opts: def.options });
    }
  };
  await register();
  c.log.info({ schedules: SCHEDULES.map((s) => s.id) }, 'scheduler started');
  // Re-assert now and then: a Redis flush or failover must not silently drop the schedules.
  const timer = setInterval(
    () =>
      void register().catch(
        (err: unknown) => c.redisOutage.heard(err, 'scheduler') || c.log.warn({ err: (err as Error).message }, 'could not register schedules'),
      ),
    60_000,
  );
  return {
    async close() {
      clearInterval(timer);
    },
  };
}
