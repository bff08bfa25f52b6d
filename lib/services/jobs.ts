import { createHash, randomUUID } from 'node:crypto';
import { enforceJobLimits } from './billing';
import type { Container } from '../container';
import { lastEventId, type AccountEvent } from '../events';
import { invalid } from '../errors';
import { findJobByIdempotencyKey, findUserJob, insertJob, isFinished, jobFiles, type JobFileRow, type JobKind, type JobProgress, type JobRow } from '../../db/jobs';

/**
 * User-visible jobs: a Postgres row the client polls (state, progress, result, error) and a BullMQ job
 * that does the work. Files live in the blob store under `jobs/<id>/`.
 */
export const jobBlob = {
  dir: (jobId: string) => `jobs/${jobId}/`,
  input: (jobId: string, n: number) => `jobs/${jobId}/in/${n}`,
  output: (jobId: string, n: number) => `jobs/${jobId}/out/${n}`,
  recipient: (jobId: string) => `jobs/${jobId}/recipient.asc`,
};

export const newJobId = () => randomUUID();

export interface JobView {
  job_id: string;
  kind: JobKind;
  state: JobRow['state'];
  status_url: string;
  progress: JobProgress;
  result: Record<string, unknown> | null;
  error: { code: string; message: string } | null;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
  expires_at: string | null;
}

export const statusUrl = (jobId: string) => `/api/v1/jobs/${jobId}`;

export async function jobView(c: Container, row: JobRow): Promise<JobView> {
  let result = row.result;
  if (row.state === 'completed' && result && Array.isArray(result.files)) {
    // Download links are derived, not stored, and vanish with the outputs.
    const outputs = row.purged_at ? [] : await jobFiles(c.db, row.id, 'output');
    result = { ...result, files: outputs.map((f) => fileView(row.id, f)), outputs_expired: Boolean(row.purged_at) };
  }
  return {
    job_id: row.id,
    kind: row.kind,
    state: row.state,
    status_url: statusUrl(row.id),
    progress: row.progress,
    result,
    error: row.error,
    created_at: row.created_at.toISOString(),
    started_at: row.started_at?.toISOString() ?? null,
    finished_at: row.finished_at?.toISOString() ?? null,
    expires_at: row.expires_at?.toISOString() ?? null,
  };
}

const fileView = (jobId: string, f: JobFileRow) => ({ n: f.n, name: f.name, size: f.size, content_type: f.content_type, download_url: `${statusUrl(jobId)}/files/${f.n}` });

export interface SubmitInput {
  id: string;
  userId: string;
  kind: JobKind;
  request: Record<string, unknown>;
  inputs?: Omit<JobFileRow, 'job_id' | 'role'>[];
  idempotencyKey?: string;
  /** requestHash() of the request, compared when its Idempotency-Key is replayed. */
  requestHash: string;
  /** The managed API key the request came with, if any. */
  apiKeyId?: string;
  requestId: string;
  /** Enqueues the BullMQ job with the given id (the row id, so a retry of submit cannot double it). */
  enqueue(jobId: string): Promise<unknown>;
}

/** Fields never part of a request hash: secrets stay out of the database, hashed or not. */
const SECRET_FIELDS = new Set(['passphrase', 'current_passphrase', 'new_passphrase']);

/**
 * What a job-submitting request asked for, as a SHA-256: its kind, its fields (secrets left out) and
 * each uploaded file's name, size and SHA-256. Two requests with one Idempotency-Key must agree on it.
 */
export function requestHash(kind: JobKind, body: unknown, files: { name: string; size: number; sha256: string }[] = []): string {
  const fields = body && typeof body === 'object' ? Object.entries(body).filter(([k]) => !SECRET_FIELDS.has(k)).sort(([a], [b]) => (a < b ? -1 : 1)) : [];
  return createHash('sha256').update(JSON.stringify({ kind, fields, files: files.map((f) => [f.name, f.size, f.sha256]) })).digest('hex');
}

/**
 * Returns the job a replayed Idempotency-Key already made, if any (the new uploads are then dropped);
 * the same key with a different request is refused (422), as Stripe does.
 */
export async function replayedJob(c: Container, userId: string, key: string | undefined, hash: string): Promise<JobRow | undefined> {
  if (!key) return undefined;
  const existing = await findJobByIdempotencyKey(c.db, userId, key);
  // Rows from before request hashes were kept (null) replay as they did.
  if (existing && existing.request_hash !== null && existing.request_hash !== hash) {
    throw invalid('idempotency_key_reused', 'This Idempotency-Key was already used for a different request; use a new key for a new request.');
  }
  return existing;
}

/** Records the job and enqueues it. A failure to enqueue removes the row and the uploads (503 follows). */
export async function submitJob(c: Container, input: SubmitInput): Promise<JobRow> {
  const files = input.inputs ?? [];
  try {
    // Plan limits (file size, concurrent jobs, monthly bytes) are counted under the account's row lock.
    await c.db.transaction(async (trx) => {
      await enforceJobLimits(c, trx, input.userId, input.kind, files.map((f) => f.size));
      await insertJob(
        trx,
        {
          id: input.id,
          user_id: input.userId,
          kind: input.kind,
          request: input.request,
          progress: files.length ? { bytes_done: 0, bytes_total: files.reduce((n, f) => n + f.size, 0), files_done: 0, files_total: files.length } : {},
          idempotency_key: input.idempotencyKey ?? null,
          request_hash: input.requestHash,
          api_key_id: input.apiKeyId ?? null,
        },
        files.map((f) => ({ ...f, role: 'input' as const })),
      );
    });
  } catch (err) {
    // Two concurrent requests with one Idempotency-Key: the loser answers with the winner's job.
    if ((err as { constraint?: string }).constraint === 'jobs_idempotency' && input.idempotencyKey) {
      await c.blob.deletePrefix(jobBlob.dir(input.id));
      const winner = await replayedJob(c, input.userId, input.idempotencyKey, input.requestHash);
      if (winner) return winner;
    }
    throw err;
  }
  try {
    await input.enqueue(input.id);
  } catch (err) {
    await c.db('jobs').where({ id: input.id }).delete();
    await c.blob.deletePrefix(jobBlob.dir(input.id)).catch(() => undefined);
    throw err;
  }
  return (await findUserJob(c.db, input.userId, input.id))!;
}

/** How often `Prefer: wait` reads the row when no event arrives (a missed event costs at most this). */
const WAIT_POLL_MS = 250;

/**
 * `Prefer: wait=N` (RFC 7240): the job as it is when it ends, or after N seconds. The row in Postgres is
 * the one source of truth (the worker commits it before it announces the end); the job's end event,
 * through the process's event hub, says when to read it again, and a slow poll covers a missed event.
 */
export async function waitForJob(c: Container, row: JobRow, seconds: number): Promise<JobRow> {
  if (isFinished(row.state)) return row;
  const deadline = Date.now() + seconds * 1000;
  let wake = () => {};
  const ended = (events: AccountEvent[]) => events.some((e) => (e.type === 'job.completed' || e.type === 'job.failed') && e.data.job_id === row.id);
  const stop = await c.eventHub.listen(row.user_id, await lastEventId(c.redis, c.config.redisPrefix, row.user_id), (events) => ended(events) && wake());
  try {
    let current = (await findUserJob(c.db, row.user_id, row.id)) ?? row;
    while (!isFinished(current.state) && Date.now() < deadline) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(WAIT_POLL_MS, deadline - Date.now()));
        wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      current = (await findUserJob(c.db, row.user_id, row.id)) ?? current;
    }
    return current;
  } finally {
    stop();
  }
}

/** Parses `Prefer: wait=N`, capped at 30 s; undefined when absent. */
export function preferWait(header: string | undefined): number | undefined {
  const match = /(?:^|[,;\s])wait=(\d+)/i.exec(header ?? '');
  return match ? Math.min(30, Number(match[1])) : undefined;
}
