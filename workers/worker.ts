import { DelayedError, UnrecoverableError, Worker, type Job } from 'bullmq';
import type { Container } from '../lib/container';
import { AppError, isOutOfReach } from '../lib/errors';
import { createRedis, connectRedis } from '../lib/redis';
import { bullPrefix } from '../jobs/client';
import { UPLOAD_QUEUE, isQueueName, type JobEnvelope, type JobOrigin, type QueueName } from '../jobs/define';
import { NO_POOL, SlotPool } from '../lib/slots';
import { processorOf } from './processors';
import { Watchdog, abortRunningJobs } from './watchdog';

export interface WorkerPool {
  workers: Worker[];
  /** Stops taking jobs, lets active ones finish, then closes connections. */
  close: () => Promise<void>;
}

/**
 * Consumes the queues this process was given (WORKER_QUEUES), each with its own concurrency. A job of
 * an unknown kind, on the wrong queue or with a payload that fails its schema is failed without retries;
 * so is a processor's client error (4xx AppError: wrong passphrase, tampered file), since retrying
 * cannot fix it.
 */
export async function startWorkers(c: Container, queues: { queue: string; concurrency: number }[]): Promise<WorkerPool> {
  const connection = createRedis(c.config, 'worker');
  c.redisOutage.watch(connection, 'worker', 'worker redis connection error');
  await connectRedis(connection);

  const workers = queues.map(({ queue, concurrency }) => {
    if (!isQueueName(queue)) throw new Error(`WORKER_QUEUES names an unknown queue "${queue}"`);
    const pool = queue === UPLOAD_QUEUE ? new SlotPool(concurrency) : undefined;
    const worker = new Worker<JobEnvelope>(queue, (job, token) => processJob(c, queue, job, pool, token), {
      connection,
      prefix: bullPrefix(c.config.redisPrefix, queue, connection.isCluster),
      concurrency: pool ? concurrency + c.config.uploadWaiters : concurrency,
      autorun: true,
      lockDuration: c.config.workerLocks.lockMs,
      stalledInterval: c.config.workerLocks.stalledCheckMs,
      // Job kinds with a schedule of their own (webhook deliveries) answer their retry delays.
      settings: { backoffStrategy: (attemptsMade, _type, _err, job) => (job && processorOf(job.name)?.retryDelayMs?.(attemptsMade, c)) ?? -1 },
    });
    worker.on('failed', (job, err) => c.log.warn({ queue, job: job?.name, job_id: job?.id, attempts: job?.attemptsMade, err: err.message }, 'job failed'));
    // Each of its connections repeats every reconnection error: a lost Redis is reported once, for all.
    worker.on('error', (err) => c.redisOutage.heard(err, `worker ${queue}`) || c.log.error({ queue, err }, 'worker error'));
    return worker;
  });
  await Promise.all(workers.map((w) => w.waitUntilReady()));
  c.log.info({ queues }, 'workers started');

  return {
    workers,
    async close() {
      const drained = Promise.all(workers.map((w) => w.close()));
      const grace = new Promise<'late'>((resolve) => setTimeout(resolve, c.config.workerLocks.shutdownGraceMs, 'late').unref());
      if ((await Promise.race([drained, grace])) === 'late') {
        // Never wait on a job for ever: stop what still runs; it goes back to the queue for another worker.
        const n = abortRunningJobs(new Error('the worker is shutting down'));
        c.log.warn({ jobs: n }, 'shutdown grace period over: active jobs stopped and requeued');
        await drained;
      }
      connection.disconnect();
    },
  };
}

/** How long a job waits after a dependency was out of reach before it runs again. */
const OUT_OF_REACH_RETRY_MS = 5000;

/** One attempt, counted and timed: completed, retried (it will run again) or failed (for good). */
async function processJob(c: Container, queue: QueueName, job: Job<JobEnvelope>, pool: SlotPool | undefined, token: string | undefined): Promise<unknown> {
  const started = process.hrtime.bigint();
  const record = (outcome: 'completed' | 'retried' | 'failed') => {
    const labels = { queue, job: processorOf(job.name) ? job.name : '(unknown)', outcome };
    c.metrics.jobs.inc(labels);
    c.metrics.jobDuration.observe(labels, Number(process.hrtime.bigint() - started) / 1e9);
  };
  try {
    const result = await runJob(c, queue, job, pool);
    record('completed');
    return result;
  } catch (err) {
    // A dependency out of reach is not the job's fault: it goes back to wait without spending an attempt
    // (unless Redis itself cannot take it back: then its lock lapses and it runs again as a stalled job).
    if (!(err instanceof UnrecoverableError) && isOutOfReach(err) && token) {
      const putBack = await job.moveToDelayed(Date.now() + OUT_OF_REACH_RETRY_MS, token).then(
        () => true,
        () => false,
      );
      if (putBack) {
        record('retried');
        c.log.warn(
          { queue, job: job.name, job_id: job.id, err: (err as Error).message },
          'a dependency is out of reach: job put back without spending an attempt',
        );
        throw new DelayedError();
      }
    }
    const last = err instanceof UnrecoverableError || job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
    record(last ? 'failed' : 'retried');
    throw err;
  }
}

async function runJob(c: Container, queue: QueueName, job: Job<JobEnvelope>, pool: SlotPool | undefined): Promise<unknown> {
  const processor = processorOf(job.name);
  if (!processor || processor.contract.queue !== queue) throw new UnrecoverableError(`no job "${job.name}" on queue "${queue}"`);
  const def = processor.contract;
  const parsed = def.schema.safeParse(job.data?.payload);
  if (!parsed.success) throw new UnrecoverableError(`payload of "${job.name}" does not match its schema`);
  const enqueued = job.data.meta;
  const log = c.log.child({ queue, job: job.name, job_id: job.id, request_id: enqueued?.request_id, client_request_id: enqueued?.client_request_id });
  try {
    const origin: JobOrigin = { request_id: enqueued?.request_id ?? null, ip: enqueued?.ip ?? null, client_request_id: enqueued?.client_request_id ?? null };
    const { timeoutMs, idleMs } = c.config.jobLimits;
    const watchdog = new Watchdog({ timeoutMs, idleMs: def.watchProgress ? idleMs : undefined });
    const slot = pool?.slot() ?? NO_POOL;
    try {
      await watchdog.excuse(slot.acquire(watchdog.signal));
      return await processor.process(parsed.data, { c, job, log, origin, watchdog, slot });
    } finally {
      slot.release();
      watchdog.stop();
    }
  } catch (err) {
    if (err instanceof AppError && err.status < 500) throw new UnrecoverableError(`${err.code}: ${err.message}`);
    throw err;
  }
}
