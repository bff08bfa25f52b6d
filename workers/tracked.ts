import { UnrecoverableError } from 'bullmq';
import type { z } from 'zod';
import type { Knex } from 'knex';
import type { JobContract, JobOrigin } from '../jobs/define';
import type { JobContext, Processor } from './define';
import type { Container } from '../lib/container';
import { addJobBytes } from '../db/api-keys';
import type { Write } from '../db/knex';
import { announceEvents, emitEvent, storeEvents } from '../lib/events';
import { type NewEvent } from '../lib/event-stream';
import { AppError, isOutOfReach, isStorageFull, storageFull } from '../lib/errors';
import { findJob, mergeProgress, requeueJob, startJobAttempt, updateJob, type JobProgress, type JobRow, type StartedJob } from '../db/jobs';
import { failJob, jobBlob } from '../lib/jobs/job-records';

/**
 * A job the client polls: its Postgres row moves queued → active → completed | failed, progress is
 * written as it goes, and the final state commits in one transaction with the job's own effects
 * (audit row, key usage, new key rows), so a crash leaves either the old state or the new one.
 * A job that finds its row finished does nothing (BullMQ may run a job twice after a crash).
 */
export interface Progress {
  /** Throttled: at most one write every PROGRESS_INTERVAL_MS. */
  report(p: JobProgress): void;
  flush(): Promise<void>;
  /** Writes nothing more; resolves once a write in flight has landed (the completion writes the final progress). */
  stop(): Promise<void>;
}

interface Completion {
  result?: Record<string, unknown>;
  progress?: JobProgress;
  /**
   * Writes that land with the completed state, in the same statement as the job row's update (db/jobs.ts
   * updateJob): one round trip. Each must touch its own rows (not the job's, not another write's).
   */
  writes?(db: Knex): Write[];
  /** Effects that need a transaction (reads, or rows written twice); may return the result (made from the rows it wrote). */
  commit?: (trx: Knex.Transaction) => Promise<Record<string, unknown> | void>;
  /** Events of the committed effects (a rotation's `keys.rotated`), stored with the completed state before `jobs.completed`. */
  events?(): NewEvent[];
  /**
   * Work once committed and announced: re-syncs to queue, uploads to delete (a crash before it leaves those
   * to the retention sweep). Failures are logged.
   */
  after?(): Promise<void>;
  /** How long the outputs are kept (default JOB_RETENTION_HOURS). */
  retentionHours?: number;
  /** Plaintext bytes the job went through, counted once it has committed (metrics by job kind). */
  processedBytes?: number;
}

interface Failure {
  code: string;
  message: string;
}

/** The work of a tracked job (jobs/tracked.ts trackedContract): `run` makes its completion, `onFailure` records a final failure. */
export interface TrackedProcessorSpec<C extends JobContract<string, z.ZodObject>> {
  /**
   * `signal` aborts when the job passes its limits: hand it to every stream and long call. `failAs` sets
   * what a failure of this attempt is recorded as, from the error that ended it (the run's own, or a
   * limit's abort reason): a decryption says nothing that depends on unverified plaintext.
   */
  run(
    row: StartedJob,
    payload: z.infer<C['schema']> & { job_id: string },
    progress: Progress,
    ctx: JobContext & { signal: AbortSignal; failAs: (map: (err: unknown) => unknown) => void },
  ): Promise<Completion>;
  /** Effects of a final failure beyond its contract's failure audit, in the transaction that marks the job failed. */
  onFailure?(trx: Knex.Transaction, row: JobRow, failure: Failure, ctx: Pick<JobContext, 'c' | 'origin'>): Promise<void>;
}

const PROGRESS_INTERVAL_MS = 500;

export function defineTrackedProcessor<C extends JobContract<string, z.ZodObject>>(contract: C, spec: TrackedProcessorSpec<C>): Processor<C> {
  /** Marks the job failed with its kind's failure effects, in one transaction; false when it had already ended. */
  const recordFailure = (c: Container, row: JobRow, failure: Failure, origin: JobOrigin) =>
    failJob(c, row, failure, origin, spec.onFailure && ((trx) => spec.onFailure!(trx, row, failure, { c, origin })));
  const announceFailure = (c: Container, row: JobRow, failure: Failure) =>
    emitEvent(c, row.user_id, 'jobs.failed', { job_id: row.id, kind: row.kind, state: 'failed', code: failure.code });
  // Not defineProcessor: this job races its own limits, so that a failure is recorded before the attempt ends.
  return {
    contract,
    async process(payload, ctx) {
      const { c, job, log, watchdog } = ctx;
      const jobId = (payload as { job_id: string }).job_id;
      // Guarded: the API fails a job whose upload broke, possibly just now (failUnfinishedJob).
      const row = await startJobAttempt(c.db, jobId, c.clock.now());
      if (!row) {
        const ended = await findJob(c.db, jobId);
        if (!ended) throw new UnrecoverableError(`job row ${jobId} is gone`);
        await forgetSecrets(ctx);
        return ended.result;
      }
      // Its blobs are sealed under the row's key: no lookup of it.
      c.jobKeys.admit(jobId, row.data_key);
      const progress = throttledProgress(c.db, jobId, row.progress, () => watchdog.touch());
      let failAs = (err: unknown) => err;
      try {
        const done = await watchdog.race(
          spec.run(row, payload as z.infer<C['schema']> & { job_id: string }, progress, {
            ...ctx,
            signal: watchdog.signal,
            failAs: (map) => void (failAs = map),
          }),
        );
        await (done.progress ? progress.stop() : progress.flush());
        const finished = c.clock.now();
        const complete = async (db: Knex, result: Record<string, unknown>) => {
          // The job's events commit with its completed state (`done.events` reads what `commit` wrote).
          const events = [...(done.events?.() ?? []), { type: 'jobs.completed' as const, data: { job_id: jobId, kind: row.kind, state: 'completed' } }];
          const writes = [...(done.writes?.(db) ?? []), storeEvents(c, db, row.user_id, events)];
          if (done.processedBytes && row.api_key_id && (row.kind === 'encrypt' || row.kind === 'decrypt'))
            writes.push(addJobBytes(db, row.api_key_id, row.kind, done.processedBytes));
          const expires_at = new Date(finished.getTime() + (done.retentionHours ?? c.config.jobRetentionHours) * 3600_000);
          await updateJob(db, jobId, { state: 'completed', result, progress: done.progress ?? row.progress, finished_at: finished, expires_at }, writes);
          return result;
        };
        const { commit } = done;
        const result = commit
          ? await c.db.transaction(async (trx) => complete(trx, (await commit(trx)) ?? done.result ?? {}))
          : await complete(c.db, done.result ?? {});
        await forgetSecrets(ctx);
        if (done.processedBytes) c.metrics.bytes.inc({ operation: row.kind }, done.processedBytes);
        // Announced before the clean-up: whoever waits for the job should not wait for that too.
        await announceEvents(c, row.user_id);
        await done.after?.().catch((e: unknown) => log.warn({ err: e }, "work after the job's completion failed"));
        return result;
      } catch (caught) {
        // A full store fails the job at once (another attempt would find it as full); it says nothing of the input.
        const err = isStorageFull(caught) ? storageFull() : failAs(caught);
        // Whatever is still running (a stalled parser) is told to stop and let go of its streams.
        watchdog.abort(err instanceof Error ? err : new Error(String(err)));
        await progress.flush().catch(() => undefined);
        const failure = describe(err);
        // An error of ours is final; a dependency out of reach never is (the worker puts the job back
        // without spending an attempt, and the reconciler ends it once it is past its time limit).
        const outOfReach = isOutOfReach(err);
        const final = !outOfReach && (err instanceof UnrecoverableError || err instanceof AppError || job.attemptsMade + 1 >= (job.opts.attempts ?? 1));
        if (!final) {
          log.warn({ err, attempt: job.attemptsMade + 1 }, 'job attempt failed; will retry');
          // The row may be out of reach too: then it says `active` until the next attempt starts it again.
          const requeued = await requeueJob(c.db, jobId, failure).catch((e: unknown) => {
            if (outOfReach) return true;
            throw e;
          });
          if (requeued) throw err;
          throw new UnrecoverableError(`job ${jobId} was failed by the API (its upload broke)`);
        }
        if (!(err instanceof AppError)) log.error({ err }, 'job failed');
        const failedHere = await recordFailure(c, row, failure, ctx.origin);
        await forgetSecrets(ctx);
        // No partial output is ever offered: everything the job stored goes.
        await c.blob.deletePrefix(jobBlob.dir(jobId)).catch((e: unknown) => log.warn({ err: e }, 'could not delete job files'));
        if (failedHere) await announceFailure(c, row, failure);
        throw err instanceof AppError ? new UnrecoverableError(`${failure.code}: ${failure.message}`) : err;
      }
    },
    async failUnfinished(c, row, failure, origin) {
      if (!(await recordFailure(c, row, failure, origin))) return false;
      // Only a job failed here loses its files: one that ended meanwhile keeps its outputs.
      await c.blob.deletePrefix(jobBlob.dir(row.id));
      await announceFailure(c, row, failure);
      return true;
    },
  };
}

/** What a kept job holds in place of each payload field but its id. */
export const FORGOTTEN = '[removed]';

/**
 * Beyond `job_id`, a tracked payload is sealed secrets, of no use once the job's row is final: the job
 * kept in its queue (KEEP_ENDED_JOBS) keeps its id only. The fields stay, blanked, so that a run of the
 * job after a crash still parses and finds its row ended.
 */
async function forgetSecrets({ job, log }: JobContext): Promise<void> {
  const payload = Object.fromEntries(Object.entries(job.data.payload as Record<string, unknown>).map(([k, v]) => [k, k === 'job_id' ? v : FORGOTTEN]));
  await job.updateData({ ...job.data, payload }).catch((err: unknown) => log.warn({ err }, "could not blank the ended job's sealed payload"));
}

/** What a client may see of an error: our codes and messages, never internals. */
function describe(err: unknown): Failure {
  if (err instanceof AppError) return { code: err.code, message: err.message };
  return { code: 'internal_error', message: 'The job failed on our side; it was retried and then given up.' };
}

function throttledProgress(db: Knex, jobId: string, initial: JobProgress, onReport: () => void): Progress {
  let latest = initial;
  let dirty = false;
  let written = Date.now();
  let chain: Promise<void> = Promise.resolve();
  let trailing: NodeJS.Timeout | undefined;
  let stopped = false;
  const write = () => {
    clearTimeout(trailing);
    trailing = undefined;
    if (!dirty) return chain;
    dirty = false;
    const snapshot = latest;
    written = Date.now();
    // Merged: the API adds the totals when the upload ends, while the worker reports what it has done.
    chain = chain
      .then(() => mergeProgress(db, jobId, snapshot))
      .then(
        () => undefined,
        () => undefined,
      );
    return chain;
  };
  return {
    report(p) {
      if (stopped) return;
      onReport();
      latest = { ...latest, ...p };
      dirty = true;
      const wait = PROGRESS_INTERVAL_MS - (Date.now() - written);
      if (wait <= 0) void write();
      // The last report before a pause (an upload the job waits for) is written too, a little later.
      else trailing ??= setTimeout(() => void write(), wait).unref();
    },
    flush: () => write(),
    stop() {
      clearTimeout(trailing);
      dirty = false;
      stopped = true;
      return chain;
    },
  };
}
