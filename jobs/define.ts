import type { Job, JobsOptions } from 'bullmq';
import type { z } from 'zod';
import type { Container } from '../lib/container';
import type { JobRow } from '../db/jobs';
import type { Logger } from '../lib/logger';
import type { Watchdog } from '../workers/watchdog';
import type { Slot } from '../lib/slots';

/** Every queue is a worker pool that ops size on its own (WORKER_QUEUES). */
export const QUEUES = ['crypto', 'rotation', 'notify', 'billing', 'team-sync', 'maintenance'] as const;
export type QueueName = (typeof QUEUES)[number];

/**
 * The queue whose jobs may start while their upload still arrives. Its concurrency (crypto=N) is a pool
 * of N slots that such a job gives back while it waits for bytes; the worker keeps WORKER_UPLOAD_WAITERS
 * more of its jobs open for that.
 */
export const UPLOAD_QUEUE: QueueName = 'crypto';

export function isQueueName(name: string): name is QueueName {
  return (QUEUES as readonly string[]).includes(name);
}

/**
 * How long an ended job stays in its queue, for the dashboard (/admin/queues) to show: a day, and at most
 * the last thousand of each queue and state. Its data holds ids and sealed values only (JobEnvelope).
 */
export const KEEP_ENDED_JOBS = {
  removeOnComplete: { age: 24 * 3600, count: 1000 },
  removeOnFail: { age: 24 * 3600, count: 1000 },
} as const satisfies JobsOptions;

/** What a job carries in Redis: ids and small values only, secrets sealed under the master key. */
export interface JobEnvelope<P = unknown> {
  payload: P;
  meta: { request_id?: string; ip?: string; enqueued_at: string };
}

/** The request that enqueued a job, as the job's audit rows record it (null for the scheduler). */
export interface JobOrigin {
  request_id: string | null;
  ip: string | null;
}

export interface JobContext {
  c: Container;
  job: Job<JobEnvelope>;
  log: Logger;
  origin: JobOrigin;
  /** This attempt's limits (JOB_TIMEOUT_SECONDS; JOB_IDLE_SECONDS for jobs that watch progress). */
  watchdog: Watchdog;
  /** The job's slot of its queue's pool (held while it runs); give it back while waiting for upload bytes. */
  slot: Slot;
}

export interface JobDefinition<S extends z.ZodType = z.ZodType, R = unknown> {
  queue: QueueName;
  name: string;
  schema: S;
  /** Defaults for attempts, back-off and retention of this kind of job. */
  options?: JobsOptions;
  /** Moves bytes: fails when progress stops for JOB_IDLE_SECONDS. */
  watchProgress?: boolean;
  /** For `backoff: {type: <custom>}`: the wait before the next try after `attemptsMade` tries, or -1 to stop. */
  retryDelayMs?(attemptsMade: number, c: Container): number;
  process(payload: z.infer<S>, ctx: JobContext): Promise<R>;
  /**
   * Jobs the client polls (jobs/tracked.ts): fails the job's row from outside any attempt, with the
   * effects of its kind's failure (audit row), deletes its files and publishes `job.failed`. False,
   * and nothing done, when the job had already ended.
   */
  failUnfinished?(c: Container, row: JobRow, failure: { code: string; message: string }, origin: JobOrigin): Promise<boolean>;
}

/** A job whose attempt loses to its wall-clock limit: a call that never settles cannot hold a worker slot. */
export function defineJob<S extends z.ZodType, R>(def: JobDefinition<S, R>): JobDefinition<S, R> {
  return { ...def, process: (payload, ctx) => ctx.watchdog.race(def.process(payload, ctx)) };
}
