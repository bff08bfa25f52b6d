import { createHash, randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import { z } from 'zod';
import { BlobNotFoundError } from '../blob';
import { readText } from '../streams';
import { enforceJobLimits, enforceUploadLimits, jobLimitsApply } from '../billing/subscriptions';
import type { Container } from '../container';
import type { Knex } from 'knex';
import { emitEvent } from '../events';
import { type AccountEvent } from '../event-stream';
import { AppError, idempotencyKeyReused, isDatabaseUnreachable, isOutOfReach, isSocketFailure, isStorageFull, storageFull, tooManyRequests } from '../errors';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Slot } from '../slots';
import {
  findJob,
  findJobWithOutputs,
  insertInputFile,
  countUploading,
  failUnfinishedJob,
  findJobByIdempotencyKey,
  freeIdempotencyKey,
  nextInput,
  type NextInput,
  findUserJob,
  insertJob,
  isFinished,
  jobFiles,
  recordUploadEnd,
  type OutputFile,
  type JobKind,
  type JobProgress,
  type JobRow,
} from '../../db/jobs';
import { lockAccount } from '../../db/users';
import { recordAudit, type AuditSource } from '../../db/audit';
import { contractOfKind } from '../../jobs/contracts';

/**
 * User-visible jobs: a Postgres row the client polls (state, progress, result, error) and a BullMQ job
 * that does the work. Files live in the blob store under `jobs/<id>/`.
 */
export const jobBlob = {
  dir: (jobId: string) => `jobs/${jobId}/`,
  inputs: (jobId: string) => `jobs/${jobId}/in/`,
  input: (jobId: string, n: number) => `jobs/${jobId}/in/${n}`,
  output: (jobId: string, n: number) => `jobs/${jobId}/out/${n}`,
  recipient: (jobId: string) => `jobs/${jobId}/recipient.asc`,
  /** Detached signature n of a verification (the signature of input n). */
  signature: (jobId: string, n: number) => `jobs/${jobId}/sig/${n}`,
  /** The end of the upload, kept while Postgres was out of reach (recordKeptUploadEnd). */
  uploadEnd: (jobId: string) => `jobs/${jobId}/upload-end`,
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

/** Who is asking for a job: the account, and the managed API key when that is the credential. */
export interface JobReader {
  id: string;
  apiKey?: { id: string };
}

/**
 * Whose jobs a caller reads: a session (or the account's partner key) every job of the account; a
 * managed API key only the jobs it submitted, so that a key scoped to its own work never reads the
 * plaintext of another credential's decryption.
 */
export const jobReadableBy = (row: Pick<JobRow, 'user_id' | 'api_key_id'>, reader: JobReader): boolean =>
  row.user_id === reader.id && (!reader.apiKey || row.api_key_id === reader.apiKey.id);

export const statusUrl = (jobId: string) => `/api/v1/jobs/${jobId}`;

/** A job as the API shows it; `outputs` when the row was read with them (findUserJob), else they are read here. */
export async function jobView(c: Container, row: JobRow & { outputs?: OutputFile[] | null }): Promise<JobView> {
  let result = row.result;
  if (row.state === 'completed' && result && Array.isArray(result.files)) {
    // Download links are derived, not stored, and vanish with the outputs.
    const outputs = row.purged_at ? [] : (row.outputs ?? (await jobFiles(c.db, row.id, 'output')));
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

const fileView = (jobId: string, f: OutputFile) => ({
  n: f.n,
  name: f.name,
  size: f.size,
  content_type: f.content_type,
  download_url: `${statusUrl(jobId)}/files/${f.n}`,
});

export interface SubmitInput {
  id: string;
  userId: string;
  kind: JobKind;
  request: Record<string, unknown>;
  /** The job's inputs still arrive (api/upload.ts): sizes, totals and the request hash come with completeUpload. */
  uploading?: boolean;
  /** The sealed data key its files are stored under (file jobs: Upload.dataKey). */
  dataKey?: string;
  idempotencyKey?: string;
  /** requestHash() of the request, compared when its Idempotency-Key is replayed; null until the upload ends. */
  requestHash: string | null;
  /** The managed API key the request came with, if any. */
  apiKeyId?: string;
  requestId: string;
  /** The request, as the audit row of a job that fails before it is queued names it. */
  from: AuditSource;
  /** Enqueues the BullMQ job with the given id (the row id, so a retry of submit cannot double it). */
  enqueue: (jobId: string) => Promise<unknown>;
}

/** Fields never part of a request hash: secrets stay out of the database, hashed or not. */
const SECRET_FIELDS = new Set(['passphrase', 'current_passphrase', 'new_passphrase']);

/**
 * What a job-submitting request asked for, as a SHA-256: its kind, its fields (secrets left out) and
 * each uploaded file's name, size and fingerprint (lib/upload-fingerprint.ts). Two requests with one
 * Idempotency-Key must agree on it; API key generation (lib/accounts/api-keys.ts) keeps it the same way.
 */
export function requestHash(kind: JobKind | 'api_keys.generate', body: unknown, files: { name: string; size: number; fingerprint: string }[] = []): string {
  const fields =
    body && typeof body === 'object'
      ? Object.entries(body)
          .filter(([k]) => !SECRET_FIELDS.has(k))
          .sort(([a], [b]) => (a < b ? -1 : 1))
      : [];
  return createHash('sha256')
    .update(JSON.stringify({ kind, fields, files: files.map((f) => [f.name, f.size, f.fingerprint]) }))
    .digest('hex');
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
    throw idempotencyKeyReused();
  }
  return existing;
}

export { idempotencyKeyReused };

/** When a replay of a key still in use may ask again: its upload is answered within seconds, or fails. */
const IN_USE_RETRY_SECONDS = 5;

/** A job with this Idempotency-Key whose upload still arrives: its request cannot be compared yet (409, as Stripe). */
export const idempotencyKeyInUse = () =>
  new AppError(409, 'idempotency_key_in_use', 'A request with this Idempotency-Key is still uploading; retry once it has been answered.', {
    headers: { 'Retry-After': String(IN_USE_RETRY_SECONDS) },
  });

/** The loser of two concurrent inserts with one Idempotency-Key. */
export class DuplicateIdempotencyKey extends Error {}

/**
 * A job recorded, then not queued: it has been failed with `cause` (what the request answers), and its
 * row tells the client so at its status URL.
 */
export class JobNotQueued extends Error {
  constructor(
    readonly row: JobRow,
    cause: unknown,
  ) {
    super('the job was recorded but could not be queued', { cause });
  }
}

/**
 * One account may have at most UPLOADS_PER_ACCOUNT uploads arriving at once: the workers keep a bounded
 * number of jobs open while they wait for bytes (WORKER_UPLOAD_WAITERS), and one account's slow clients
 * must not take all of them.
 */
async function enforceUploadShare(c: Container, trx: Knex.Transaction, userId: string): Promise<void> {
  // NO KEY UPDATE: serialises with the account's other submissions, not with inserts that merely reference it.
  await lockAccount(trx, userId, 'no key update');
  const limit = c.config.uploadsPerAccount;
  if ((await countUploading(trx, userId, c.config.jobLimits.timeoutMs)) < limit) return;
  throw tooManyRequests(`This account already has ${limit} uploads in progress; send this one when one of them has arrived.`, 5, 'too_many_uploads');
}

/**
 * Records the job and enqueues it; while Redis is not connected, refuses before recording anything (503
 * `queue_unavailable`). An enqueue that fails once the job is recorded (Redis frozen or lost meanwhile)
 * fails the job at once with that error, as the reconciler would fail it later, and throws JobNotQueued.
 * An enqueue whose answer was lost may still reach the queue: its worker then finds the job ended and
 * does nothing.
 */
export async function submitJob(c: Container, input: SubmitInput): Promise<JobRow> {
  c.jobs.assertConnected();
  const record = (db: Knex) =>
    insertJob(db, {
      id: input.id,
      user_id: input.userId,
      kind: input.kind,
      request: input.request,
      progress: {},
      idempotency_key: input.idempotencyKey ?? null,
      request_hash: input.requestHash,
      api_key_id: input.apiKeyId ?? null,
      uploaded_at: input.uploading ? null : c.clock.now(),
      data_key: input.dataKey ?? null,
    });
  let row: JobRow;
  try {
    // Plan limits (concurrent jobs, monthly bytes so far) and the account's share of uploads are counted
    // under the account's row lock; an upload's own sizes are checked as it arrives and again when it
    // ends (completeUpload).
    row =
      input.uploading || jobLimitsApply(c, input.kind)
        ? await c.db.transaction(async (trx) => {
            if (input.uploading) await enforceUploadShare(c, trx, input.userId);
            await enforceJobLimits(c, trx, input.userId, input.kind, []);
            return record(trx);
          })
        : await record(c.db);
  } catch (err) {
    if ((err as { constraint?: string }).constraint === 'jobs_idempotency' && input.idempotencyKey) throw new DuplicateIdempotencyKey();
    throw err;
  }
  try {
    await input.enqueue(input.id);
  } catch (err) {
    const failure = err instanceof AppError ? err : { code: 'internal_error', message: 'The job could not be queued.' };
    // Left unfailed (Postgres lost too), the job is the reconciler's: its queue entry is missing.
    await abandonJob(c, row, failure, input.from).catch((failed: unknown) =>
      c.log.warn({ err: failed, job_id: row.id }, 'a job that could not be queued could not be failed either; the reconciler will'),
    );
    throw new JobNotQueued(row, err);
  }
  return row;
}

/**
 * The end of a whole upload that could not be recorded (Postgres out of reach), kept beside the job's
 * files (jobBlob.uploadEnd) so that whoever next reaches Postgres records it: the API process that
 * received the upload, the worker that waits for it, or the reconciler. Like every blob under
 * `jobs/<id>/` it is sealed under the job's data key and bound to its name (lib/blob/sealed.ts): it opens
 * only as this job's record, written by the service, not by whoever can write to the blob store.
 */
const KeptUploadEnd = z.object({
  job_id: z.uuid(),
  files: z.array(z.object({ n: z.number().int().min(0), size: z.number().int().min(0) })).min(1),
  request_hash: z.string().regex(/^[0-9a-f]{64}$/),
});
type KeptUploadEnd = z.infer<typeof KeptUploadEnd>;
const KEPT_UPLOAD_END_MAX_BYTES = 64 * 1024;

/** How often a worker waiting for its upload's end looks for a kept one. */
const KEPT_END_LOOK_MS = 1000;

/** The longest pause between the background attempts of the API process that answered 503 (back-off from 1 s). */
const KEPT_END_RETRY_MAX_MS = 10_000;

/** Only Postgres is asked while an end is recorded: a bare socket error (a connection reset as it opened) is its too. */
const postgresOutOfReach = (err: unknown) => isDatabaseUnreachable(err) || isSocketFailure(err);

/**
 * The upload of a running job has ended: its files' sizes and totals are recorded, the plan's limits
 * checked on the real sizes, and `uploaded_at` set, which tells the worker that no more files come.
 * The files are whole in the blob store by now, so an out-of-reach database does not lose the upload:
 * the end is kept in the blob store at the first failure and recorded again for UPLOAD_END_RETRY_SECONDS
 * before the client is answered 503; this process then goes on recording it in the background (`from`
 * is the request, for the audit row of a plan limit found crossed then). The record is safe to repeat,
 * since an attempt whose answer was lost may have committed.
 */
export async function completeUpload(c: Container, row: JobRow, files: { n: number; size: number }[], hash: string, from: AuditSource): Promise<JobRow> {
  const deadline = Date.now() + c.config.uploadEndRetryMs;
  let kept = false;
  for (let delay = 250; ; delay = Math.min(delay * 2, 2000)) {
    try {
      const recorded = await recordCompletedUpload(c, row, files, hash);
      if (kept) await c.blob.delete(jobBlob.uploadEnd(row.id)).catch(() => undefined);
      return recorded;
    } catch (err) {
      if (!postgresOutOfReach(err)) throw err;
      kept ||= await keepUploadEnd(c, { job_id: row.id, files, request_hash: hash });
      if (Date.now() + delay > deadline) {
        void recordInBackground(c, row, { job_id: row.id, files, request_hash: hash }, from);
        throw err;
      }
      c.log.warn({ job_id: row.id, err: (err as Error).message }, 'the database is out of reach as an upload ends; recording its end again shortly');
      await sleep(delay);
    }
  }
}

/** Writes the end of an upload beside its files; false when the blob store refused it too (this process still records it). */
async function keepUploadEnd(c: Container, record: KeptUploadEnd): Promise<boolean> {
  try {
    await c.blob.put(jobBlob.uploadEnd(record.job_id), Readable.from([Buffer.from(JSON.stringify(record))]));
    return true;
  } catch (err) {
    c.log.warn({ job_id: record.job_id, err }, 'could not keep the end of an upload in the blob store; this process records it once Postgres answers');
    return false;
  }
}

/**
 * The API process answered 503: it records the end as soon as Postgres answers, for as long as the job
 * could still run (JOB_TIMEOUT_SECONDS). A worker or the reconciler may come first (the record is then
 * found made), and a process that stops meanwhile leaves it to them.
 */
async function recordInBackground(c: Container, row: JobRow, record: KeptUploadEnd, from: AuditSource): Promise<void> {
  const until = row.created_at.getTime() + c.config.jobLimits.timeoutMs;
  for (let delay = 1000; Date.now() < until; delay = Math.min(delay * 2, KEPT_END_RETRY_MAX_MS)) {
    await sleep(delay, undefined, { ref: false });
    try {
      await recordKeptEnd(c, row, record, from);
      c.log.info({ job_id: row.id }, 'recorded the end of an upload that ended while the database was out of reach');
      return;
    } catch (err) {
      if (postgresOutOfReach(err)) continue;
      c.log.warn({ job_id: row.id, err }, 'could not record the end of an upload kept in the blob store; a worker or the reconciler will');
      return;
    }
  }
}

/**
 * Records a kept end (recordCompletedUpload) and removes its record. A plan limit crossed by the real
 * sizes fails the job as it would have failed the request.
 */
async function recordKeptEnd(c: Container, row: JobRow, record: KeptUploadEnd, from: AuditSource): Promise<void> {
  try {
    await recordCompletedUpload(c, row, record.files, record.request_hash);
  } catch (err) {
    if (!(err instanceof AppError) || isOutOfReach(err)) throw err;
    await failUpload(c, row, err, from);
  }
  await c.blob.delete(jobBlob.uploadEnd(row.id)).catch(() => undefined);
}

/**
 * Records the end of job `row`'s upload from the record its API process kept in the blob store, when
 * there is one: true once recorded (or failed on a plan limit). The record is checked against the job
 * before it is trusted: it names this job, and its files are the job's inputs with the sizes they have
 * in the blob store; its request hash is then the job's, compared like any repeat of the record.
 */
export async function recordKeptUploadEnd(c: Container, row: JobRow, from: AuditSource): Promise<boolean> {
  if (row.uploaded_at !== null || isFinished(row.state)) return false;
  if (!(await c.blob.stat(jobBlob.uploadEnd(row.id)))) return false;
  let record: KeptUploadEnd;
  try {
    record = KeptUploadEnd.parse(JSON.parse(await readText(await c.blob.get(jobBlob.uploadEnd(row.id)), KEPT_UPLOAD_END_MAX_BYTES)));
  } catch (err) {
    if (err instanceof BlobNotFoundError) return false; // recorded and removed meanwhile
    if (isOutOfReach(err)) throw err;
    c.log.warn({ job_id: row.id, err }, "the kept end of an upload does not open as this job's record; ignored");
    return false;
  }
  if (!(await matchesInputs(c, row, record))) {
    c.log.warn({ job_id: row.id }, "the kept end of an upload does not match the job's stored inputs; ignored");
    return false;
  }
  await recordKeptEnd(c, row, record, from);
  return true;
}

/** The record names the job, and lists exactly its input rows, each as large as its stored file. */
async function matchesInputs(c: Container, row: JobRow, record: KeptUploadEnd): Promise<boolean> {
  if (record.job_id !== row.id) return false;
  const inputs = (await jobFiles(c.db, row.id, 'input')).map((f) => f.n).sort((a, b) => a - b);
  const listed = record.files.map((f) => f.n).sort((a, b) => a - b);
  if (inputs.length !== listed.length || inputs.some((n, i) => n !== listed[i])) return false;
  for (const f of record.files) if ((await c.blob.stat(jobBlob.input(row.id, f.n)))?.size !== f.size) return false;
  return true;
}

async function recordCompletedUpload(c: Container, row: JobRow, files: { n: number; size: number }[], hash: string): Promise<JobRow> {
  const record = (db: Knex) => recordUploadEnd(db, row.id, files, c.clock.now(), hash);
  // Plan limits are checked on the real sizes under the account's lock, in one transaction with the
  // record; an end already recorded (by an earlier attempt, or another process from the kept record) is
  // not checked again: its bytes would count twice.
  const recorded = jobLimitsApply(c, row.kind)
    ? await c.db.transaction(async (trx) => {
        await lockAccount(trx, row.user_id, 'no key update');
        if ((await findJob(trx, row.id))?.uploaded_at) return undefined;
        await enforceUploadLimits(
          c,
          trx,
          row.user_id,
          row.kind,
          files.map((f) => f.size),
        );
        return record(trx);
      })
    : await record(c.db);
  if (recorded) return recorded;
  const current = (await findUserJob(c.db, row.user_id, row.id))!;
  if (current.state === 'failed') {
    // The job failed while its files still arrived (a damaged first file): the answer is that job, and
    // what the rest of the upload stored after the worker's clean-up goes too.
    await c.blob.deletePrefix(jobBlob.dir(row.id)).catch(() => undefined);
    return current;
  }
  // An earlier attempt of this record committed and only its answer was lost, or another process
  // recorded the end from the kept record: the same request either way.
  if (current.request_hash === hash) return current;
  throw new Error(`the end of the upload of job ${row.id} was recorded with another request hash`);
}

/**
 * Marks an unfinished job failed with its kind's failure audit row (contract `failureAudit`) and what
 * `also` records, in one transaction: every way a job fails (worker, upload, reconciler) leaves the same
 * trace. False when the job had already ended (nothing is recorded then).
 */
export async function failJob(
  c: Container,
  row: JobRow,
  failure: { code: string; message: string },
  from: AuditSource,
  also?: (trx: Knex.Transaction) => Promise<void>,
): Promise<boolean> {
  const audit = contractOfKind[row.kind].failureAudit;
  return c.db.transaction(async (trx) => {
    if (!(await failUnfinishedJob(trx, row.id, failure, c.clock.now()))) return false;
    if (audit) {
      const details = { job_id: row.id, code: failure.code };
      await recordAudit(trx, { user_id: row.user_id, action: audit.action, status: 'failure', target: audit.target(row.request), details }, from);
    }
    await also?.(trx);
    return true;
  });
}

/**
 * The upload of a job broke (client gone, a limit crossed, the store full): the job fails with the
 * request's own error, unless it has already ended, and everything it stored goes. Its worker, following
 * the inputs, stops. False when the job had already ended: its own failure came first (and its clean-up
 * may be what broke the upload).
 */
export async function failUpload(c: Container, row: JobRow, err: unknown, from: AuditSource): Promise<boolean> {
  // The code the client is answered with (a full store is 507 `storage_full`, api/middleware/errors.ts).
  const known = isStorageFull(err) ? storageFull() : err;
  return abandonJob(c, row, known instanceof AppError ? known : { code: 'upload_failed', message: 'The upload could not be stored.' }, from);
}

/**
 * A submitted job that will not run (its upload broke, or it could not be queued) fails with the
 * request's error unless it has already ended, and everything it stored goes. False when it had ended.
 */
async function abandonJob(c: Container, row: JobRow, failure: { code: string; message: string }, from: AuditSource): Promise<boolean> {
  const error = { code: failure.code, message: failure.message };
  const failed = await failJob(c, row, error, from);
  // The request was not done: its Idempotency-Key is free for the client to send it again.
  await freeIdempotencyKey(c.db, row.id);
  await c.blob.deletePrefix(jobBlob.dir(row.id)).catch(() => undefined);
  if (failed) await emitEvent(c, row.user_id, 'jobs.failed', { job_id: row.id, kind: row.kind, state: 'failed', code: error.code });
  return failed;
}

/**
 * Input n of a job once its upload has begun (its row exists), else why there is none: the upload
 * ended with fewer files (`uploaded`), or the job ended (`state`). While the upload still arrives it
 * waits, polling the row with a short back-off: the worker and a follower of the output both do.
 * `started`: a follower also waits while the job is queued, since its output has no writer yet (the
 * follower's idle limit is for a writer that stopped, not for a queue). A job waiting for its own
 * upload gives its `slot` back meanwhile (it takes it again itself).
 * `keptEnd`: the job's own worker also looks, now and then, for the end its API process kept in the blob
 * store while Postgres was out of reach (recordKeptUploadEnd), and records it.
 * `known`: input n as a statement just read it (the job's start), in place of the first read.
 */
export async function arrivingInput(
  c: Container,
  jobId: string,
  n: number,
  signal?: AbortSignal,
  opts: { started?: boolean; slot?: Slot; keptEnd?: boolean; known?: NextInput } = {},
): Promise<NextInput> {
  let known = opts.known;
  // A next file usually follows at once: the blob store is asked only once the wait has lasted.
  let lookForKeptEnd = Date.now() + KEPT_END_LOOK_MS;
  for (let delay = 2; ;) {
    signal?.throwIfAborted();
    const next = known ?? (await nextInput(c.db, jobId, n));
    known = undefined;
    const settled = next.state === undefined || isFinished(next.state) || (next.uploaded && !next.file);
    if (settled || (next.file && !(opts.started && next.state === 'queued'))) return next;
    if (opts.keptEnd && !next.file && Date.now() >= lookForKeptEnd) {
      lookForKeptEnd = Date.now() + KEPT_END_LOOK_MS;
      const row = await findJob(c.db, jobId);
      if (row && (await recordKeptUploadEnd(c, row, {}))) continue;
    }
    opts.slot?.release();
    await sleep(delay, undefined, { signal });
    // A queue may hold a job for minutes: its followers ask less often than for an upload's next file.
    delay = Math.min(delay * 2, next.state === 'queued' ? 1000 : 200);
  }
}

/**
 * How often `Prefer: wait` (and an upload whose job may fail first) reads the row when no event arrives: insurance against a missed event (it
 * costs at most this), not the way waits end, so it need not be often (at 250 ms, 40 waiting clients
 * read their rows ~160 times a second for nothing).
 */
export const WAIT_POLL_MS = 1000;

/** The end of one job as this process's event hub sees it, from the moment the watch began. */
export interface JobEndWatch {
  /** Waits at most `ms` for the job's end event; true when it came (since the watch began or the last call). */
  next(ms: number): Promise<boolean>;
  stop(): void;
}

/** Watches for job `jobId`'s `jobs.completed` or `jobs.failed`; `onEnd` sees the event as it arrives. */
export async function watchJobEnd(c: Container, userId: string, jobId: string, onEnd?: (event: AccountEvent) => void): Promise<JobEndWatch> {
  let seen = false;
  let wake: (() => void) | undefined;
  const stop = await c.eventHub.listen(userId, undefined, (events) => {
    for (const e of events) {
      if ((e.type !== 'jobs.completed' && e.type !== 'jobs.failed') || e.data.job_id !== jobId) continue;
      seen = true;
      onEnd?.(e);
      wake?.();
    }
  });
  return {
    stop,
    next: (ms) =>
      new Promise<boolean>((resolve) => {
        if (seen) {
          seen = false;
          return resolve(true);
        }
        const timer = setTimeout(() => {
          wake = undefined;
          resolve(false);
        }, ms);
        wake = () => {
          clearTimeout(timer);
          wake = undefined;
          seen = false;
          resolve(true);
        };
      }),
  };
}

/**
 * `Prefer: wait=N` (RFC 7240): the job as it is when it ends, or after N seconds. The row in Postgres is
 * the one source of truth (the worker commits it before it announces the end); the job's end event,
 * through the process's event hub, says when to read it again, and a slow poll covers a missed event.
 * `watch`, when given, began before `row` was read, so no end can have slipped between the two; without
 * one, the wait begins its own and reads the row again.
 */
export async function waitForJob(c: Container, row: JobRow, seconds: number, watch?: JobEndWatch): Promise<JobRow> {
  if (isFinished(row.state)) return row;
  const deadline = Date.now() + seconds * 1000;
  const own = watch ? undefined : await watchJobEnd(c, row.user_id, row.id);
  try {
    let current = own ? ((await findUserJob(c.db, row.user_id, row.id)) ?? row) : row;
    while (!isFinished(current.state) && Date.now() < deadline) {
      await (watch ?? own!).next(Math.min(WAIT_POLL_MS, deadline - Date.now()));
      current = (await findUserJob(c.db, row.user_id, row.id)) ?? current;
    }
    return current;
  } finally {
    own?.stop();
  }
}

/**
 * `Prefer: early-hints`: the client reads informational answers, so a file job may say where it is
 * (103 Early Hints) before its upload has been answered. Never sent unasked: many HTTP clients take a
 * 1xx for the final answer and then read the real one as the reply to their next request.
 */
export function preferEarlyHints(header: string | undefined): boolean {
  return /(?:^|,)\s*early-hints\s*(?:[,;]|$)/i.test(header ?? '');
}

/** Parses `Prefer: wait=N`, capped at 30 s; undefined when absent. */
export function preferWait(header: string | undefined): number | undefined {
  const match = /(?:^|[,;\s])wait=(\d+)/i.exec(header ?? '');
  return match ? Math.min(30, Number(match[1])) : undefined;
}

/** Whether a job's state is final (completed or failed). */
export { isFinished };

/** A job with its outputs, whoever owns it: the caller checks it may read it (jobReadableBy). */
export const jobWithOutputs = (c: Container, id: string) => findJobWithOutputs(c.db, id);

/** A job's row as it is now (undefined once deleted). */
export const currentJob = (c: Container, id: string): Promise<JobRow | undefined> => findJob(c.db, id);

/** The account's job submitted with this Idempotency-Key, if any. */
export const jobOfIdempotencyKey = (c: Container, userId: string, key: string): Promise<JobRow | undefined> => findJobByIdempotencyKey(c.db, userId, key);

/** Records an input file of a job as its upload opens it (name and type; the size comes with the upload's end). */
export const recordInputFile = (c: Container, jobId: string, file: { n: number; name: string; content_type: string }): Promise<void> =>
  insertInputFile(c.db, jobId, file);
