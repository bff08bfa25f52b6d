import type { Knex } from 'knex';
import { columnsOf, prepared, preparedByShape, withWrites, type Write } from './knex';

export type JobState = 'queued' | 'active' | 'completed' | 'failed';
export type JobKind = 'encrypt' | 'decrypt' | 'generate-key' | 'rotate-key' | 'rewrap' | 'sign' | 'verify';

/** A job in one of these states will not change again. */
export const isFinished = (state: JobState): boolean => state === 'completed' || state === 'failed';

export interface JobProgress {
  bytes_done?: number;
  bytes_total?: number;
  files_done?: number;
  files_total?: number;
}

export interface JobRow {
  id: string;
  user_id: string;
  kind: JobKind;
  state: JobState;
  request: Record<string, unknown>;
  progress: JobProgress;
  result: Record<string, unknown> | null;
  error: { code: string; message: string } | null;
  idempotency_key: string | null;
  request_hash: string | null;
  /** The managed API key that submitted the job, if one did (its usage counts the job's bytes). */
  api_key_id: string | null;
  /** When the last input finished uploading; null while the upload still arrives (the job may already run). */
  uploaded_at: Date | null;
  /** The key its blobs are sealed under, itself sealed under the master key (lib/blob/data-keys.ts); null for jobs without files and jobs from before it was kept here. */
  data_key: string | null;
  attempts: number;
  created_at: Date;
  started_at: Date | null;
  finished_at: Date | null;
  expires_at: Date | null;
  purged_at: Date | null;
}

export interface JobFileRow {
  job_id: string;
  role: 'input' | 'output';
  n: number;
  name: string;
  size: number;
  content_type: string;
}

/** Every column of `jobs`, for the prepared statements of a job's hot path (db/knex.ts prepared). */
const JOB_COLUMNS = columnsOf<JobRow>({
  id: 1,
  user_id: 1,
  kind: 1,
  state: 1,
  request: 1,
  progress: 1,
  result: 1,
  error: 1,
  idempotency_key: 1,
  request_hash: 1,
  api_key_id: 1,
  uploaded_at: 1,
  data_key: 1,
  attempts: 1,
  created_at: 1,
  started_at: 1,
  finished_at: 1,
  expires_at: 1,
  purged_at: 1,
}).join(', ');

export const findJob = async (db: Knex, id: string): Promise<JobRow | undefined> => db<JobRow>('jobs').where({ id }).first();
/** A job as its owner reads it: with its output files once it has completed, until they are purged (else null). */
export type UserJobRow = JobRow & { outputs: OutputFile[] | null };
// The outputs come in the same statement: a status read of a finished job and a download need both. The
// row is found by its id alone and its owner compared below: with the owner in the WHERE clause, a plan made
// while the table had no statistics took the (user_id, created_at) index and read every job of the account.
const userJob = prepared<UserJobRow>(
  'user_job',
  `SELECT ${JOB_COLUMNS},
     CASE WHEN state = 'completed' AND purged_at IS NULL THEN
       (SELECT coalesce(json_agg(json_build_object('n', f.n, 'name', f.name, 'size', f.size, 'content_type', f.content_type) ORDER BY f.n), '[]')
        FROM job_files f WHERE f.job_id = jobs.id AND f.role = 'output')
     END AS outputs
   FROM jobs WHERE id = :id`,
);
/** A job with its outputs, whoever owns it: the caller compares the owner (findUserJob, or a route that audits another's). */
export const findJobWithOutputs = async (db: Knex, id: string): Promise<UserJobRow | undefined> => (await userJob(db, { id }))[0];
export async function findUserJob(db: Knex, userId: string, id: string): Promise<UserJobRow | undefined> {
  const row = await findJobWithOutputs(db, id);
  return row?.user_id === userId ? row : undefined;
}
/** A job's sealed data key (lib/blob/data-keys.ts), for a process that has not read its row. */
export const jobDataKey = async (db: Knex, id: string): Promise<string | null | undefined> =>
  (await db<JobRow>('jobs').where({ id }).first('data_key'))?.data_key;

/** A job whose request was never done (an upload that broke, a lost job): its Idempotency-Key can be sent again. */
export const freeIdempotencyKey = async (db: Knex, id: string): Promise<void> => {
  await db<JobRow>('jobs').where({ id }).update({ idempotency_key: null });
};
export const findJobByIdempotencyKey = async (db: Knex, userId: string, key: string): Promise<JobRow | undefined> =>
  db<JobRow>('jobs').where({ user_id: userId, idempotency_key: key }).first();

type NewJob = Pick<JobRow, 'id' | 'user_id' | 'kind' | 'request' | 'progress' | 'idempotency_key' | 'request_hash' | 'api_key_id' | 'uploaded_at' | 'data_key'>;
const NEW_JOB_COLUMNS = columnsOf<NewJob>({
  id: 1,
  user_id: 1,
  kind: 1,
  request: 1,
  progress: 1,
  idempotency_key: 1,
  request_hash: 1,
  api_key_id: 1,
  uploaded_at: 1,
  data_key: 1,
});
const newJob = prepared<JobRow>(
  'insert_job',
  `INSERT INTO jobs (${NEW_JOB_COLUMNS.join(', ')}) VALUES (${NEW_JOB_COLUMNS.map((c) => `:${c}`).join(', ')}) RETURNING ${JOB_COLUMNS}`,
);

export async function insertJob(db: Knex, row: NewJob): Promise<JobRow> {
  const values = Object.fromEntries(NEW_JOB_COLUMNS.map((c) => [c, row[c] ?? null]));
  const [inserted] = await newJob(db, { ...values, request: JSON.stringify(row.request), progress: JSON.stringify(row.progress) });
  return inserted;
}

const filesOf = prepared<JobFileRow>(
  'job_files',
  `SELECT job_id, role, n, name, size, content_type FROM job_files WHERE job_id = :id AND role = :role ORDER BY n`,
);
export const jobFiles = async (db: Knex, jobId: string, role: JobFileRow['role']): Promise<JobFileRow[]> => filesOf(db, { id: jobId, role });

/**
 * Updates a job row; `alongside`, writes to other tables, run in the same statement as data-modifying
 * CTEs (one round trip, atomic without a transaction). They must not touch the job row or each other's rows.
 */
export async function updateJob(db: Knex, id: string, patch: Partial<Omit<JobRow, 'id' | 'user_id' | 'kind'>>, alongside: Write[] = []): Promise<void> {
  const jsonColumns = new Set(['request', 'progress', 'result', 'error']);
  const values = Object.fromEntries(
    Object.entries(patch)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => [k, jsonColumns.has(k) && v !== null ? JSON.stringify(v) : v]),
  );
  const jobs = db<object>('jobs');
  withWrites(jobs, alongside);
  await preparedByShape(jobs.where({ id }).update(values));
}

/** Merges keys into the job's progress (the API adds totals when the upload ends, the worker what it has done). */
export const mergeProgress = async (db: Knex, id: string, patch: JobProgress): Promise<void> => {
  await db('jobs')
    .where({ id })
    .update({ progress: db.raw('progress || ?::jsonb', [JSON.stringify(patch)]) });
};

/** An input as its upload starts (size 0 until it ends): from then on the worker may follow it. */
const inputFile = prepared<never>(
  'insert_input_file',
  `INSERT INTO job_files (job_id, role, n, name, content_type, size) VALUES (:id, 'input', :n, :name, :content_type, 0)`,
);
export async function insertInputFile(db: Knex, jobId: string, f: Omit<JobFileRow, 'job_id' | 'role' | 'size'>): Promise<void> {
  await inputFile(db, { id: jobId, n: f.n, name: f.name, content_type: f.content_type });
}

/**
 * Records the end of a job's upload in one statement: each input's size, the totals merged into its
 * progress, `uploaded_at` and the request's hash. Undefined when the job failed meanwhile, or its upload
 * was already recorded.
 */
const uploadEnd = prepared<JobRow>(
  'record_upload_end',
  `WITH sizes AS (
     UPDATE job_files SET size = s.size FROM unnest(CAST(:ns AS int[]), CAST(:sizes AS bigint[])) AS s(n, size)
     WHERE job_files.job_id = :id AND job_files.role = 'input' AND job_files.n = s.n
   )
   UPDATE jobs SET progress = progress || CAST(:totals AS jsonb), uploaded_at = :at, request_hash = :hash
   WHERE id = :id AND uploaded_at IS NULL AND state <> 'failed'
   RETURNING ${JOB_COLUMNS}`,
);
export async function recordUploadEnd(
  db: Knex,
  jobId: string,
  files: { n: number; size: number }[],
  at: Date,
  requestHash: string,
): Promise<JobRow | undefined> {
  const totals: JobProgress = { bytes_total: files.reduce((n, f) => n + f.size, 0), files_total: files.length };
  const [row] = await uploadEnd(db, {
    id: jobId,
    ns: files.map((f) => f.n),
    sizes: files.map((f) => f.size),
    totals: JSON.stringify(totals),
    at,
    hash: requestHash,
  });
  return row;
}

export interface NextInput {
  file?: JobFileRow;
  /** The upload has ended (no more inputs will come). */
  uploaded: boolean;
  /** Once the upload has ended: how many inputs it had (a reader of the last one need not ask again). */
  inputs?: number;
  /** The job's state; undefined when the job is gone. */
  state?: JobState;
}

interface InputColumns {
  uploaded_at: Date | null;
  state: JobState;
  n: number | null;
  name: string;
  size: number;
  content_type: string;
  inputs: number;
}

/** The columns of input `:n` and of the job's upload, for a statement that selects FROM jobs (or a row of it) LEFT JOIN job_files f. */
const inputColumns = (jobs: string) => `f.n, f.name, f.size, f.content_type,
  (SELECT CAST(count(*) AS int) FROM job_files i WHERE i.job_id = ${jobs}.id AND i.role = 'input') AS inputs`;
const inputJoin = (jobs: string) => `LEFT JOIN job_files f ON f.job_id = ${jobs}.id AND f.role = 'input' AND f.n = :n`;

const inputOf = prepared<InputColumns>(
  'next_input',
  `SELECT jobs.uploaded_at, jobs.state, ${inputColumns('jobs')} FROM jobs ${inputJoin('jobs')} WHERE jobs.id = :id`,
);

const toNextInput = (jobId: string, row: InputColumns): NextInput => {
  const file = row.n === null ? undefined : { job_id: jobId, role: 'input' as const, n: row.n, name: row.name, size: row.size, content_type: row.content_type };
  const uploaded = row.uploaded_at !== null;
  return { file, uploaded, ...(uploaded ? { inputs: row.inputs } : {}), state: row.state };
};

/** Input `n` of a job, or, when there is none, whether the upload has ended or failed. */
export async function nextInput(db: Knex, jobId: string, n: number): Promise<NextInput> {
  const [row] = await inputOf(db, { id: jobId, n });
  return row ? toNextInput(jobId, row) : { uploaded: false };
}

/** A job as an attempt starts it, with its first input as nextInput would find it then (a file job reads it next). */
export type StartedJob = JobRow & { firstInput: NextInput };

const attempt = prepared<JobRow & Omit<InputColumns, 'uploaded_at' | 'state'>>(
  'start_job_attempt',
  `WITH started AS (
     UPDATE jobs SET state = 'active', started_at = coalesce(started_at, :at), attempts = attempts + 1, error = NULL
      WHERE id = :id AND state NOT IN ('completed', 'failed')
      RETURNING ${JOB_COLUMNS}
   )
   SELECT ${JOB_COLUMNS.split(', ')
     .map((c) => `started.${c}`)
     .join(', ')}, ${inputColumns('started')} FROM started ${inputJoin('started')}`,
);

/** Marks an unfinished job active for one more attempt, in the statement that reads its first input; undefined when it has ended (or is gone). */
export async function startJobAttempt(db: Knex, id: string, at: Date): Promise<StartedJob | undefined> {
  const [started] = await attempt(db, { id, at, n: 0 });
  if (!started) return undefined;
  const { n, name, size, content_type, inputs, ...row } = started;
  return { ...row, firstInput: toNextInput(id, { n, name, size, content_type, inputs, uploaded_at: row.uploaded_at, state: row.state }) };
}

/**
 * Failures that say nothing of the request: the queue lost the job, or the store had no room for its
 * output. The client's retry with the same Idempotency-Key must run it again, not replay the failure.
 */
const FAILURES_OF_THE_SERVICE = ['job_lost', 'storage_full'];

/**
 * Marks an unfinished job failed (an upload that broke); false when it had already finished. Workers'
 * own failure writes use the same guard, so neither overwrites the other. A job that fails before its
 * upload ended (the API process that received it died) frees its Idempotency-Key: the request never
 * arrived whole, and the client's retry must become a job; so does one failed by the service itself.
 */
export async function failUnfinishedJob(db: Knex, id: string, error: { code: string; message: string }, at: Date): Promise<boolean> {
  const freed = FAILURES_OF_THE_SERVICE.includes(error.code);
  const idempotency_key = freed ? null : db.raw('CASE WHEN uploaded_at IS NULL THEN NULL ELSE idempotency_key END');
  const n = await db('jobs')
    .where({ id })
    .whereNotIn('state', ['completed', 'failed'])
    .update({ state: 'failed', error: JSON.stringify(error), finished_at: at, expires_at: at, idempotency_key });
  return n > 0;
}

export type OutputFile = Omit<JobFileRow, 'job_id' | 'role'>;

/** A job's output rows (at least one file), not yet run: a write that lands with the job's completion (workers/tracked.ts `writes`). */
export const outputFilesInsert = (db: Knex, jobId: string, files: OutputFile[]): Write =>
  db<object>('job_files')
    .insert(files.map((f) => ({ ...f, job_id: jobId, role: 'output' })))
    .onConflict(['job_id', 'role', 'n'])
    .merge();

/** A job's output rows (at least one file). */
export const insertOutputFiles = async (db: Knex, jobId: string, files: OutputFile[]): Promise<void> => {
  await outputFilesInsert(db, jobId, files);
};

/** Jobs not finished that were created after `after` and before `before`, oldest first (the reconciler's candidates, a page at a time). */
export const unfinishedJobsBetween = async (db: Knex, after: Date, before: Date, limit: number): Promise<JobRow[]> =>
  db<JobRow>('jobs')
    .whereNull('finished_at')
    .whereIn('state', ['queued', 'active'])
    .where('created_at', '<', before)
    .where('created_at', '>', after)
    .orderBy('created_at')
    .limit(limit);

/** Jobs whose outputs have outlived their retention and not been deleted yet. */
export const expiredJobs = async (db: Knex, now: Date, limit: number): Promise<JobRow[]> =>
  db<JobRow>('jobs').whereNull('purged_at').where('expires_at', '<=', now).orderBy('expires_at').limit(limit);

/**
 * The account's jobs whose upload still arrives (they start before their files have all come), among
 * those that can still finish (younger than the job time limit, by the database's clock).
 */
export async function countUploading(db: Knex, userId: string, jobTimeoutMs: number): Promise<number> {
  const [row] = await uploading(db, { user_id: userId, seconds: jobTimeoutMs / 1000 });
  return row?.n ?? 0;
}
const uploading = prepared<{ n: number }>(
  'count_uploading_jobs',
  `SELECT count(*) AS n FROM jobs
    WHERE user_id = :user_id AND state IN ('queued', 'active') AND uploaded_at IS NULL
      AND created_at > now() - make_interval(secs => :seconds)`,
);

/** An attempt failed and another comes: the job is queued again (unless it has ended meanwhile). False when it had ended. */
export async function requeueJob(db: Knex, id: string, error: { code: string; message: string }): Promise<boolean> {
  const n = await db('jobs')
    .where({ id })
    .whereNotIn('state', ['completed', 'failed'])
    .update({ state: 'queued', error: JSON.stringify(error) });
  return n > 0;
}

/**
 * Jobs that still need a lineage's generations: decrypt and rewrap jobs of the lineage, and encrypt jobs
 * to one of its generations, while queued or running. Destruction waits for them.
 */
export async function jobsNeedingLineage(db: Knex, lineageId: string, keyIds: string[]): Promise<number> {
  const [row] = await db<JobRow>('jobs')
    .whereIn('state', ['queued', 'active'])
    .andWhere((w) => {
      w.where((x) => {
        x.whereIn('kind', ['decrypt', 'rewrap']).andWhereRaw("request->>'lineage_id' = ?", [lineageId]);
      });
      if (keyIds.length)
        w.orWhere((x) => {
          x.where('kind', 'encrypt').andWhereRaw("request->'recipient'->>'key_id' = ANY(?::text[])", [keyIds]);
        });
    })
    .count<{ count: string }[]>({ count: '*' });
  return Number(row?.count ?? 0);
}
