import type { JobsOptions } from 'bullmq';
import type { z } from 'zod';
import type { AuditAction } from '../lib/event-names';

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
  meta: { request_id?: string; client_request_id?: string; ip?: string; enqueued_at: string };
}

/** The request that enqueued a job, as the job's audit rows record it (null for the scheduler). */
export interface JobOrigin {
  request_id: string | null;
  ip: string | null;
  /** The client's own id of that request, when it sent one the API keeps. */
  client_request_id?: string | null;
}

/** The origin as the request meta that services take (what they enqueue in turn carries it on). */
export const originMeta = (o: JobOrigin) => ({
  ip: o.ip ?? undefined,
  requestId: o.request_id ?? undefined,
  clientRequestId: o.client_request_id ?? undefined,
});

/** How the final failure of a job a client polls is audited: its action, and the key its stored request names. */
export interface FailureAudit {
  action: AuditAction;
  target(request: unknown): string | null;
}

/**
 * What producers (API, services, scheduler) and consumers (workers/processors.ts) agree on for one kind
 * of job: its name, its queue and the payload it carries. The work itself is the worker's alone.
 */
export interface JobContract<N extends string = string, S extends z.ZodType = z.ZodType> {
  name: N;
  queue: QueueName;
  schema: S;
  /** Defaults for attempts, back-off and retention of this kind of job. */
  options?: JobsOptions;
  /** Moves bytes: fails when progress stops for JOB_IDLE_SECONDS. */
  watchProgress?: boolean;
  /** Tracked jobs: the audit row of a final failure, wherever it is recorded (worker, upload, reconciler). */
  failureAudit?: FailureAudit;
}

export function defineContract<N extends string, S extends z.ZodType>(contract: JobContract<N, S>): JobContract<N, S> {
  return contract;
}
