import { z } from 'zod';
import { KEEP_ENDED_JOBS, defineContract, type FailureAudit, type JobContract, type QueueName } from './define';
import type { AuditAction } from '../lib/event-names';

export type TrackedSchema<S extends z.ZodObject> = z.ZodObject<S['shape'] & { job_id: z.ZodUUID }>;

/**
 * A job the client polls: its Postgres row holds the request and, in the end, the outcome; the payload
 * carries the row's id and what the row must never hold (sealed secrets). Its processor is a tracked
 * one (workers/tracked.ts).
 */
export function trackedContract<N extends string, S extends z.ZodObject = z.ZodObject<Record<never, never>>>(spec: {
  queue: QueueName;
  name: N;
  /** Payload beyond `job_id` (e.g. a sealed passphrase). */
  extra?: S;
  attempts?: number;
  /** Jobs that move bytes fail when their progress stops for JOB_IDLE_SECONDS (all jobs have JOB_TIMEOUT_SECONDS). */
  watchProgress?: boolean;
  failureAudit?: FailureAudit;
}): JobContract<N, TrackedSchema<S>> {
  return defineContract({
    queue: spec.queue,
    name: spec.name,
    watchProgress: spec.watchProgress,
    failureAudit: spec.failureAudit,
    schema: (spec.extra ?? z.object({})).extend({ job_id: z.uuid() }),
    // The ended job stays a while for the dashboard, its sealed secrets blanked by its processor.
    options: { attempts: spec.attempts ?? 3, backoff: { type: 'exponential', delay: 2000 }, ...KEEP_ENDED_JOBS },
  });
}

/** A job's failure audit: `action`, on the key its stored request names (none when the row's request does not parse). */
export function failureAudit<T>(action: AuditAction, request?: z.ZodType<T>, target?: (r: T) => string): FailureAudit {
  return {
    action,
    target(raw) {
      const parsed = request?.safeParse(raw);
      return parsed?.success && target ? target(parsed.data) : null;
    },
  };
}

/** AAD of the passphrase a tracked job carries sealed (decrypt, rewrap, sign, sign and encrypt): it opens for this one job only. */
export const passphraseAad = (jobId: string) => `decrypt-passphrase:${jobId}`;
