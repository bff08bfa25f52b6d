import { ErrorCode, type Job, type JobType } from 'bullmq';
import type { Container } from '../container';
import { QUEUES, type QueueName } from '../../jobs/define';
import { conflict, notFound } from '../errors';
import { recordAudit, type RequestMeta } from '../../db/audit';

/**
 * The queues as administrators see them (the console's queue view), on BullMQ's own API. Job data is never
 * shown: it holds ids and sealed values (JobEnvelope), nothing an operator needs to read.
 */
export const COUNTED_STATES = ['waiting', 'active', 'delayed', 'prioritized', 'waiting-children', 'failed', 'completed'] as const satisfies readonly JobType[];
/** The states a job list can be asked for: every state a job sits in for a while. */
export const LISTED_STATES = ['waiting', 'active', 'delayed', 'prioritized', 'failed', 'completed'] as const satisfies readonly JobType[];
export type ListedState = (typeof LISTED_STATES)[number];

export interface QueueJobView {
  job_id: string;
  name: string;
  state: string;
  attempts_made: number;
  failed_reason: string | null;
  created_at: string;
  processed_at: string | null;
  finished_at: string | null;
}

const isoOf = (ms: number | undefined | null) => (ms ? new Date(ms).toISOString() : null);

async function viewOf(job: Job, state?: string): Promise<QueueJobView> {
  return {
    job_id: String(job.id),
    name: job.name,
    state: state ?? (await job.getState()),
    attempts_made: job.attemptsMade,
    failed_reason: job.failedReason || null,
    created_at: new Date(job.timestamp).toISOString(),
    processed_at: isoOf(job.processedOn),
    finished_at: isoOf(job.finishedOn),
  };
}

/** Every queue with its jobs counted by state, and whether it is paused. */
export async function queueSummaries(c: Container) {
  return Promise.all(
    QUEUES.map(async (name) => {
      const queue = c.jobs.queue(name);
      const [counts, paused] = await Promise.all([queue.getJobCounts(...COUNTED_STATES), queue.isPaused()]);
      return {
        queue: name,
        paused,
        counts: Object.fromEntries(COUNTED_STATES.map((s) => [s, counts[s] ?? 0])) as Record<(typeof COUNTED_STATES)[number], number>,
      };
    }),
  );
}

/** A queue's newest `limit` jobs, of one state or of all, newest first. */
export async function recentJobs(c: Container, name: QueueName, state: ListedState | undefined, limit: number): Promise<QueueJobView[]> {
  const queue = c.jobs.queue(name);
  const states = state ? [state] : LISTED_STATES;
  // Each state's newest `limit`, merged by creation: the newest `limit` of all of them are among these.
  const found = await Promise.all(states.map(async (s) => (await queue.getJobs([s], 0, limit - 1, false)).map((job) => ({ job, state: s }))));
  const newest = found
    .flat()
    .filter(({ job }) => job)
    .sort((a, b) => b.job.timestamp - a.job.timestamp)
    .slice(0, limit);
  return Promise.all(newest.map(({ job, state: s }) => viewOf(job, s)));
}

/** Puts a failed job back in its queue (its attempts count on), audited as `queue_jobs.retry`. */
export async function retryFailedJob(c: Container, name: QueueName, jobId: string, actor: string, meta: RequestMeta): Promise<QueueJobView> {
  const job = await c.jobs.queue(name).getJob(jobId);
  if (!job) throw notFound('job_not_found', `No job "${jobId}" in queue "${name}" (ended jobs are kept for a day).`);
  const notFailed = (now: string) => conflict('job_not_failed', `Only a failed job can be retried; this one is ${now}.`);
  const state = await job.getState();
  if (state !== 'failed') throw notFailed(state);
  // Redis moves it only from the failed set: of two retries at once, the second finds it moved.
  await job.retry('failed').catch(async (err: unknown) => {
    const code = (err as { code?: unknown }).code;
    if (code === ErrorCode.JobNotInState || code === ErrorCode.JobNotExist) throw notFailed(await job.getState());
    throw err;
  });
  await recordAudit(c.db, { user_id: actor, action: 'queue_jobs.retry', status: 'success', target: `${name}/${jobId}`, details: { name: job.name } }, meta);
  return viewOf(job);
}
