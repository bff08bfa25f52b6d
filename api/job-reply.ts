import type { Container } from '../lib/container';
import { invalid } from '../lib/errors';
import { jobView, preferWait, replayedJob, requestHash, submitJob, waitForJob } from '../lib/services/jobs';
import { isFinished, type JobKind, type JobRow } from '../db/jobs';
import type { UploadedFile } from './middleware/multipart';
import type { AppContext, Reply } from './route';

/**
 * How every job-submitting endpoint answers: 202 with Location and the job, or, when the client sent
 * `Prefer: wait=N` and the job ended within N seconds, 200 with the finished job.
 */
export async function replyWithJob(c: Container, ctx: AppContext, row: JobRow): Promise<Reply> {
  const { row: current, wait } = await waitAsPreferred(c, ctx, row);
  const body = await jobView(c, current);
  if (wait !== undefined && isFinished(current.state)) return { status: 200, body, headers: { 'Preference-Applied': `wait=${wait}` } };
  return { status: 202, body, headers: { Location: body.status_url } };
}

/** Honours `Prefer: wait=N`: the job as it is after at most N seconds of waiting for it to end. */
export async function waitAsPreferred(c: Container, ctx: AppContext, row: JobRow): Promise<{ row: JobRow; wait?: number }> {
  const wait = preferWait(ctx.get('prefer'));
  return { row: wait ? await waitForJob(c, row, wait) : row, wait };
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
  /** Uploaded files that become the job's inputs. */
  inputs?: (UploadedFile & { sha256: string })[];
}

/**
 * What every job-submitting endpoint does: a replayed Idempotency-Key answers with the first job;
 * otherwise `prepare` (checks, the stored request, how to enqueue) runs and the job is recorded,
 * enqueued and answered (202, or 200 under `Prefer: wait`).
 */
export async function submitAndReply(
  c: Container,
  ctx: AppContext,
  job: JobSubmission,
  prepare: () => Promise<{ request: Record<string, unknown>; enqueue(jobId: string): Promise<unknown> }>,
): Promise<Reply> {
  const key = idempotencyKey(ctx);
  const hash = requestHash(job.kind, job.body, job.inputs);
  const replay = await replayedJob(c, job.userId, key, hash);
  if (replay) return replyWithJob(c, ctx, replay);
  const { request, enqueue } = await prepare();
  const row = await submitJob(c, {
    id: job.id,
    userId: job.userId,
    kind: job.kind,
    request,
    inputs: job.inputs?.map((f) => ({ n: f.n, name: f.name, size: f.size, content_type: f.contentType })),
    idempotencyKey: key,
    requestHash: hash,
    apiKeyId: ctx.state.user?.apiKey?.id,
    requestId: job.requestId,
    enqueue,
  });
  return replyWithJob(c, ctx, row);
}
