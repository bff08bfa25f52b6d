import type { Container } from '../lib/container';
import { invalid, isOutOfReach, storageFull } from '../lib/errors';
import {
  completeUpload,
  DuplicateIdempotencyKey,
  JobNotQueued,
  failUpload,
  idempotencyKeyInUse,
  currentJob,
  idempotencyKeyReused,
  isFinished,
  jobOfIdempotencyKey,
  jobReadableBy,
  jobView,
  preferEarlyHints,
  preferWait,
  replayedJob,
  requestHash,
  statusUrl,
  submitJob,
  waitForJob,
  watchJobEnd,
  WAIT_POLL_MS,
  type JobEndWatch,
} from '../lib/jobs/job-records';
import type { JobKind, JobRow } from '../db/jobs';
import type { Upload } from './upload';
import type { Reply } from './route';
import type { AppContext } from './context';
import { requestMeta } from './middleware/request-context';

/**
 * How every job-submitting endpoint answers: 202 with Location and the job, or, when the client sent
 * `Prefer: wait=N` and the job ended within N seconds, 200 with the finished job.
 */
async function replyWithJob(c: Container, ctx: AppContext, row: JobRow, watch?: JobEndWatch): Promise<Reply> {
  const { row: current, wait } = await waitAsPreferred(c, ctx, row, watch);
  const body = await jobView(c, current);
  if (wait !== undefined && isFinished(current.state)) return { status: 200, body, headers: { 'Preference-Applied': `wait=${wait}` } };
  return { status: 202, body, headers: { Location: body.status_url } };
}

/**
 * Honours `Prefer: wait=N`: the job as it is after at most N seconds of waiting for it to end. A `watch`
 * begun before `row` was read saves reading it again (see waitForJob).
 */
async function waitAsPreferred(c: Container, ctx: AppContext, row: JobRow, watch?: JobEndWatch): Promise<{ row: JobRow; wait?: number }> {
  const wait = preferWait(ctx.get('prefer'));
  return { row: wait ? await waitForJob(c, row, wait, watch) : row, wait };
}

/** A job read as `Prefer: wait=N` asks: when waiting, the watch begins before `read`, so the row is read once. */
export async function readAsPreferred(c: Container, ctx: AppContext, userId: string, jobId: string, read: () => Promise<JobRow>): Promise<JobRow> {
  if (!preferWait(ctx.get('prefer'))) return read();
  const watch = await watchJobEnd(c, userId, jobId);
  try {
    return (await waitAsPreferred(c, ctx, await read(), watch)).row;
  } finally {
    watch.stop();
  }
}

/** `Idempotency-Key` header: up to 255 visible ASCII characters, or absent. */
export function idempotencyKey(ctx: AppContext): string | undefined {
  const key = ctx.get('idempotency-key');
  if (!key) return undefined;
  if (!/^[\x21-\x7e]{1,255}$/.test(key)) throw invalid('invalid_idempotency_key', 'Idempotency-Key must be 1-255 visible ASCII characters.');
  return key;
}

export interface JobSubmission {
  id: string;
  userId: string;
  kind: JobKind;
  requestId: string;
  /** The validated request body: with the inputs, what an Idempotency-Key replay must match. */
  body: unknown;
  /** The uploaded files that become the job's inputs (file jobs). */
  upload?: Upload;
}

/**
 * What every job-submitting endpoint does: a replayed Idempotency-Key answers with the first job;
 * otherwise `prepare` (checks, the stored request, how to enqueue) runs and the job is recorded,
 * enqueued and answered (202, or 200 under `Prefer: wait`). A file job is enqueued at its first file
 * and runs while the rest arrives (api/upload.ts); it is answered when the upload has ended.
 */
export async function submitAndReply(
  c: Container,
  ctx: AppContext,
  job: JobSubmission,
  prepare: () => Promise<{ request: Record<string, unknown>; enqueue: (jobId: string) => Promise<unknown> }>,
): Promise<Reply> {
  const { upload } = job;
  if (upload && !upload.streaming) throw invalid('no_files', 'Attach at least one file in the form field "files".');
  const key = idempotencyKey(ctx);
  const replay = key ? await jobOfIdempotencyKey(c, job.userId, key) : undefined;
  if (replay) return replyToReplay(c, ctx, job, key!, replay);
  const { request, enqueue } = await prepare();
  // The job's end is watched from before it can end, when something waits for it: its upload (a job that
  // fails while its files still arrive, a damaged first file, is answered at once: the rest of the upload
  // is drained, not stored) and a `Prefer: wait`, which then needs no second read of the row.
  const ended = new JobEndedDuringUpload();
  let uploading = Boolean(upload);
  const watch =
    upload || preferWait(ctx.get('prefer'))
      ? await watchJobEnd(c, job.userId, job.id, (e) => {
          if (uploading && e.type === 'jobs.failed') upload!.stop(ended);
        })
      : undefined;
  try {
    let row: JobRow;
    try {
      row = await submitJob(c, {
        id: job.id,
        userId: job.userId,
        kind: job.kind,
        request,
        uploading: Boolean(upload),
        dataKey: upload?.dataKey,
        idempotencyKey: key,
        requestHash: upload ? null : requestHash(job.kind, job.body),
        apiKeyId: ctx.state.user?.apiKey?.id,
        requestId: job.requestId,
        from: requestMeta(ctx),
        enqueue,
      });
    } catch (err) {
      // Two concurrent requests with one Idempotency-Key: the loser answers as a replay of the winner.
      if (err instanceof DuplicateIdempotencyKey) return await replyToReplay(c, ctx, job, key!, (await jobOfIdempotencyKey(c, job.userId, key!))!);
      // Recorded, then failed for want of its queue: the problem names the job (job_id, status_url).
      if (err instanceof JobNotQueued) {
        ctx.state.jobId = err.row.id;
        throw err.cause;
      }
      throw err;
    }
    ctx.state.jobId = row.id;
    if (upload) {
      // The job runs from now on, while its files arrive: to a client that asked (`Prefer: early-hints`),
      // say where it is at once (103 Early Hints, a `monitor` link, RFC 8297 and 5989), so that it can
      // follow the job, or download the ciphertext of an encryption as it is produced (`?follow=true`),
      // before this request has been answered.
      if (preferEarlyHints(ctx.get('prefer'))) ctx.res.writeEarlyHints({ link: `<${statusUrl(row.id)}>; rel="monitor"` });
      upload.begin(true);
      // The same insurance as a wait's against a missed end event: the row is read now and then.
      const poll = setInterval(() => {
        void currentJob(c, row.id).then(
          (now) => uploading && now?.state === 'failed' && upload.stop(ended),
          () => undefined,
        );
      }, WAIT_POLL_MS);
      let whole = false;
      let broken = false;
      try {
        const files = await upload.files();
        whole = true;
        row = await completeUpload(c, row, files, requestHash(job.kind, job.body, files), requestMeta(ctx));
      } catch (err) {
        // A whole upload whose end could not be recorded (Postgres out of reach past the retries) is not
        // a broken upload: its files are kept, and the job waits for its end as for a slow client's.
        if (whole && isOutOfReach(err)) throw err;
        // A job that failed first is the answer, whether its event stopped the upload or its clean-up
        // (the job's files deleted) broke a write before the event arrived.
        if (await failUpload(c, row, err, requestMeta(ctx))) throw err;
        broken = true;
        row = (await currentJob(c, row.id)) ?? row;
      } finally {
        clearInterval(poll);
        uploading = false;
      }
      // A job that ran out of room before its upload was answered (its output did not fit while the
      // files arrived) kept nothing, as an upload that did not fit keeps nothing: it is answered the
      // same (507 with the job), and its Idempotency-Key freed as a broken upload's, so the retry runs.
      if (row.state === 'failed' && row.error?.code === 'storage_full') {
        if (!broken) await failUpload(c, row, storageFull(), requestMeta(ctx));
        throw storageFull();
      }
    }
    return await replyWithRecorded(c, ctx, row, watch);
  } finally {
    watch?.stop();
  }
}

/**
 * The answer to a request that has recorded and enqueued its job: the job runs whatever happens next, so
 * a read that fails while waiting for it or showing it (Postgres lost meanwhile) must not become an error
 * answer, which a client takes for "nothing done" and repeats (a second rotation). It is answered 202
 * with the job as this request recorded it, whose status URL tells the rest.
 */
async function replyWithRecorded(c: Container, ctx: AppContext, row: JobRow, watch?: JobEndWatch): Promise<Reply> {
  try {
    return await replyWithJob(c, ctx, row, watch);
  } catch (err) {
    c.log.warn({ err, job_id: row.id }, 'job recorded, but reading it for the answer failed: answered with the job as recorded');
    const body = await jobView(c, row);
    return { status: 202, body, headers: { Location: body.status_url } };
  }
}

/** What ends an upload whose job has already failed (the answer is then that job). */
class JobEndedDuringUpload extends Error {
  constructor() {
    super('the job failed while its files were uploading');
  }
}

/** The same Idempotency-Key again: the first job if the request is the same (its files fingerprinted as they arrive), else 422. */
async function replyToReplay(c: Container, ctx: AppContext, job: JobSubmission, key: string, first: JobRow): Promise<Reply> {
  // Another credential's job is not the caller's to read: its key is taken, whatever the request.
  if (!jobReadableBy(first, ctx.state.user!)) throw idempotencyKeyReused();
  if (first.uploaded_at === null) throw idempotencyKeyInUse();
  job.upload?.begin(false, first.data_key ? first.id : undefined);
  const files = job.upload ? await job.upload.files() : [];
  const same = await replayedJob(c, job.userId, key, requestHash(job.kind, job.body, files));
  return replyWithJob(c, ctx, same ?? first);
}
