import { z } from 'zod';
import { route } from '../../route';
import { QUEUES } from '../../../jobs/define';
import { Timestamp, wholeNumber } from '../../schemas/common';
import { COUNTED_STATES, LISTED_STATES, queueSummaries, recentJobs, retryFailedJob } from '../../../lib/operations/queues';

/**
 * The console's queue view on BullMQ's own API, for administrators: counts by state, recent jobs with
 * why they failed, and the retry of a failed job. Job data is never shown: it holds ids and sealed values
 * (JobEnvelope), nothing an operator needs to read.
 */
const tags = ['Monitoring'];

const QueueName = z.enum(QUEUES).describe('A queue of jobs/define.ts');
const Counts = z.object(Object.fromEntries(COUNTED_STATES.map((s) => [s, z.number().int()])) as Record<(typeof COUNTED_STATES)[number], z.ZodNumber>);
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
      return { headers: { 'Cache-Control': 'no-store' }, body: { queues: await queueSummaries(c), dashboard: c.config.monitoring.queueDashboard } };
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
      state: z.enum(LISTED_STATES).optional().describe('Only jobs in this state; all states when left out'),
      limit: wholeNumber(1, 100).default(20),
    }),
    responses: { 200: { description: 'The jobs', schema: z.object({ queue: QueueName, jobs: z.array(QueueJob) }) } },
    async handler({ c, params, query }) {
      return { headers: { 'Cache-Control': 'no-store' }, body: { queue: params.queue, jobs: await recentJobs(c, params.queue, query.state, query.limit) } };
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
      return { status: 202, body: await retryFailedJob(c, params.queue, params.job_id, user.id, meta) };
    },
  }),
];
