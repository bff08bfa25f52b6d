import { z } from 'zod';
import { ErrorCode, type Job, type JobType } from 'bullmq';
import { route } from '../../route';
import { QUEUES } from '../../../jobs/define';
import { isoOrNull, Timestamp, wholeNumber } from '../../schemas/common';
import { conflict, notFound } from '../../../lib/errors';
import { recordAudit } from '../../../db/audit';

/**
 * The console's queue view on BullMQ's own API, for administrators: counts by state, recent jobs with
 * why they failed, and the retry of a failed job. Job data is never shown: it holds ids and sealed values
 * (JobEnvelope), nothing an operator needs to read.
 */
const tags = ['Monitoring'];

const STATES = ['waiting', 'active', 'delayed', 'prioritized', 'waiting-children', 'failed', 'completed'] as const satisfies readonly JobType[];
/** The states a job list can be asked for: every state a job sits in for a while. */
const LISTED = ['waiting', 'active', 'delayed', 'prioritized', 'failed', 'completed'] as const satisfies readonly JobType[];

const QueueName = z.enum(QUEUES).describe('A queue of jobs/define.ts');
const Counts = z.object(Object.fromEntries(STATES.map((s) => [s, z.number().int()])) as Record<(typeof STATES)[number], z.ZodNumber>);
const QueueSummary = z
  .object({ queue: QueueName, paused: z.boolean().describe('Workers take no job from it while paused'), counts: Counts })
  .meta({ id: 'QueueSummary' });
const QueueJob = z
  .object({
    job_id: z.string(),
    name: z.string().describe('The kind of job (jobs/contracts.ts)'),
    state: z.string().describe('BullMQ state: waiting, active, delayed, prioritized, failed, completed, …'),
    attempts_made: z.number().int().describe('Runs so far (a retry runs it again)'),
    failed_reason: z.string().nullable().describe('Why its last run failed; null when it did not'),
    created_at: Timestamp,
    processed_at: Timestamp.nullable().describe('When its last run started'),
    finished_at: Timestamp.nullable().describe('When its last run ended'),
  })
  .meta({ id: 'QueueJob' });
const JobId = z.string().regex(/^[\w.-]{1,200}$/, { error: 'must be a job id (letters, digits, _ . -)' });

async function presentJob(job: Job, state?: string) {
  return {
    job_id: String(job.id),
    name: job.name,
    state: state ?? (await job.getState()),
    attempts_made: job.attemptsMade,
    failed_reason: job.failedReason || null,
    created_at: new Date(job.timestamp).toISOString(),
    processed_at: isoOrNull(job.processedOn ? new Date(job.processedOn) : null),
    finished_at: isoOrNull(job.finishedOn ? new Date(job.finishedOn) : null),
  };
}

export default [
  route({
    method: 'get',
    path: '/admin/queues',
    summary: 'Every job queue with its counts by state and whether it is paused',
    tags,
    access: 'admin',
    responses: {
      200: {
        description: 'The queues',
        schema: z.object({
          queues: z.array(QueueSummary),
          dashboard: z.enum(['off', 'read-only', 'read-write']).describe('Bull Board at /admin/queues (QUEUE_DASHBOARD)'),
        }),
      },
    },
    async handler({ c }) {
      const queues = await Promise.all(
        QUEUES.map(async (name) => {
          const queue = c.jobs.queue(name);
          const [counts, paused] = await Promise.all([queue.getJobCounts(...STATES), queue.isPaused()]);
          return { queue: name, paused, counts: Object.fromEntries(STATES.map((s) => [s, counts[s] ?? 0])) };
        }),
      );
      return { headers: { 'Cache-Control': 'no-store' }, body: { queues, dashboard: c.config.monitoring.queueDashboard } };
    },
  }),

  route({
    method: 'get',
    path: '/admin/queues/{queue}/jobs',
    summary: "A queue's most recent jobs (newest first), of one state or of all, with why each failed",
    tags,
    access: 'admin',
    params: z.object({ queue: QueueName }),
    query: z.object({
      state: z.enum(LISTED).optional().describe('Only jobs in this state; all states when left out'),
      limit: wholeNumber(1, 100).default(20),
    }),
    responses: { 200: { description: 'The jobs', schema: z.object({ queue: QueueName, jobs: z.array(QueueJob) }) } },
    async handler({ c, params, query }) {
      const queue = c.jobs.queue(params.queue);
      const states = query.state ? [query.state] : LISTED;
      // Each state's newest `limit`, merged by creation: the newest `limit` of all of them are among these.
      const found = await Promise.all(states.map(async (s) => (await queue.getJobs([s], 0, query.limit - 1, false)).map((job) => ({ job, state: s }))));
      const newest = found
        .flat()
        .filter(({ job }) => job)
        .sort((a, b) => b.job.timestamp - a.job.timestamp)
        .slice(0, query.limit);
      return {
        headers: { 'Cache-Control': 'no-store' },
        body: { queue: params.queue, jobs: await Promise.all(newest.map(({ job, state }) => presentJob(job, state))) },
      };
    },
  }),

  route({
    method: 'post',
    path: '/admin/queues/{queue}/jobs/{job_id}/retry',
    summary: 'Runs a failed job again (its attempts count on); audited as `queue_jobs.retry`',
    tags,
    access: 'admin',
    params: z.object({ queue: QueueName, job_id: JobId }),
    responses: {
      202: { description: 'Back in the queue: a worker runs it again', schema: QueueJob },
      404: { description: 'No such job in the queue (ended jobs are kept a day)' },
      409: { description: 'The job is not failed' },
    },
    async handler({ c, params, user, meta }) {
      const job = await c.jobs.queue(params.queue).getJob(params.job_id);
      if (!job) throw notFound('job_not_found', `No job "${params.job_id}" in queue "${params.queue}" (ended jobs are kept for a day).`);
      const state = await job.getState();
      const notFailed = (now: string) => conflict('job_not_failed', `Only a failed job can be retried; this one is ${now}.`);
      if (state !== 'failed') throw notFailed(state);
      // Redis moves it only from the failed set: of two retries at once, the second finds it moved.
      await job.retry('failed').catch(async (err: unknown) => {
        const code = (err as { code?: unknown }).code;
        if (code === ErrorCode.JobNotInState || code === ErrorCode.JobNotExist) throw notFailed(await job.getState());
        throw err;
      });
      await recordAudit(
        c.db,
        { user_id: user.id, action: 'queue_jobs.retry', status: 'success', target: `${params.queue}/${params.job_id}`, details: { name: job.name } },
        meta,
      );
      return { status: 202, body: await presentJob(job) };
    },
  }),
];
