import type { Knex } from 'knex';

export type JobState = 'queued' | 'active' | 'completed' | 'failed';
export type JobKind = 'encrypt' | 'decrypt' | 'generate-key' | 'rotate-key' | 'rewrap';

/** A job in one of these states will not change again. */
export const isFinished = (state: JobState) => state === 'completed' || state === 'failed';

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

export const findJob = (db: Knex, id: string) => db<JobRow>('jobs').where({ id }).first();
export const findUserJob = (db: Knex, userId: string, id: string) => db<JobRow>('jobs').where({ id, user_id: userId }).first();
export const findJobByIdempotencyKey = (db: Knex, userId: string, key: string) => db<JobRow>('jobs').where({ user_id: userId, idempotency_key: key }).first();

export async function insertJob(db: Knex, row: Pick<JobRow, 'id' | 'user_id' | 'kind' | 'request' | 'progress' | 'idempotency_key' | 'request_hash' | 'api_key_id'>, files: Omit<JobFileRow, 'job_id'>[] = []): Promise<void> {
  await db('jobs').insert({ ...row, request: JSON.stringify(row.request), progress: JSON.stringify(row.progress) });
  if (files.length) await db('job_files').insert(files.map((f) => ({ ...f, job_id: row.id })));
}

export const jobFiles = (db: Knex, jobId: string, role: JobFileRow['role']) => db<JobFileRow>('job_files').where({ job_id: jobId, role }).orderBy('n');

export async function updateJob(db: Knex, id: string, patch: Partial<Omit<JobRow, 'id' | 'user_id' | 'kind'>>): Promise<void> {
  const jsonColumns = new Set(['request', 'progress', 'result', 'error']);
  const values = Object.fromEntries(
    Object.entries(patch)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => [k, jsonColumns.has(k) && v !== null ? JSON.stringify(v) : v]),
  );
  await db('jobs').where({ id }).update(values);
}

export type OutputFile = Omit<JobFileRow, 'job_id' | 'role'>;

export const insertOutputFiles = (db: Knex, jobId: string, files: OutputFile[]) =>
  files.length ? db('job_files').insert(files.map((f) => ({ ...f, job_id: jobId, role: 'output' }))).onConflict(['job_id', 'role', 'n']).merge() : Promise.resolve();

/** Jobs whose outputs have outlived their retention and not been deleted yet. */
export const expiredJobs = (db: Knex, now: Date, limit: number) =>
  db<JobRow>('jobs').whereNull('purged_at').where('expires_at', '<=', now).orderBy('expires_at').limit(limit);
