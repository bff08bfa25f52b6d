import type { Job } from 'bullmq';
import type { z } from 'zod';
import type { Container } from '../lib/container';
import type { JobRow } from '../db/jobs';
import type { Logger } from '../lib/logger';
import type { Slot } from '../lib/slots';
import type { JobContract, JobEnvelope, JobOrigin } from '../jobs/define';
import type { Watchdog } from './watchdog';

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

/** The work behind one job contract, run by a worker (workers/processors.ts). */
export interface Processor<C extends JobContract = JobContract> {
  contract: C;
  process(payload: z.infer<C['schema']>, ctx: JobContext): Promise<unknown>;
  /** For `backoff: {type: <custom>}`: the wait before the next try after `attemptsMade` tries, or -1 to stop. */
  retryDelayMs?(attemptsMade: number, c: Container): number;
  /**
   * Jobs the client polls (workers/tracked.ts): fails the job's row from outside any attempt, with the
   * effects of its kind's failure (audit row), deletes its files and publishes `jobs.failed`. False,
   * and nothing done, when the job had already ended.
   */
  failUnfinished?(c: Container, row: JobRow, failure: { code: string; message: string }, origin: JobOrigin): Promise<boolean>;
}

/** A processor whose attempt loses to its wall-clock limit: a call that never settles cannot hold a worker slot. */
export function defineProcessor<C extends JobContract>(contract: C, def: Omit<Processor<C>, 'contract' | 'failUnfinished'>): Processor<C> {
  return { ...def, contract, process: (payload, ctx) => ctx.watchdog.race(def.process(payload, ctx)) };
}
