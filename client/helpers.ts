import { mkdir } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { ClientError } from './errors.js';
import { newIdempotencyKey, type Kms } from './http.js';
import { downloadJobFile, isFinished, submitMultipart, waitForJob, type Job, type OnProgress } from './jobs.js';
import type { Upload } from './uploads.js';

export interface FileJobOptions {
  files: Upload[];
  /** Where outputs are written (created if missing). Default: the current folder. */
  outDir?: string;
  /** Replace existing output files. Default false (ClientError `output_exists`). */
  overwrite?: boolean;
  /** Only submit and wait; do not download the outputs. */
  noDownload?: boolean;
  idempotencyKey?: string;
  /** `Prefer: wait=N` on the submission. Default 2. */
  waitSeconds?: number;
  onProgress?: OnProgress;
  /** Told once the job exists (before it ends), e.g. to print its id. */
  onSubmitted?(job: Job): void;
}

export interface Output {
  n: number;
  name: string;
  size: number;
  path: string;
}

export interface FileJobResult {
  job: Job;
  outputs: Output[];
}

export interface EncryptOptions extends FileJobOptions {
  /** A stored key, by any generation's fingerprint; or */
  fingerprint?: string;
  /** an armored public key (the text), e.g. someone's gpg key. */
  publicKey?: string;
  /** ASCII armor (`.asc`) instead of binary (`.gpg`). */
  armor?: boolean;
  compress?: boolean;
}

export interface DecryptOptions extends FileJobOptions {
  fingerprint: string;
  passphrase: string;
}

export interface RewrapOptions extends DecryptOptions {
  /** `rewrap` re-encrypts the session key to the current generation; `reencrypt` the whole message. */
  mode?: 'rewrap' | 'reencrypt';
}

export interface RotateOptions {
  fingerprint: string;
  /** Changes the passphrase as well (both needed). */
  currentPassphrase?: string;
  newPassphrase?: string;
  idempotencyKey?: string;
  waitSeconds?: number;
  onProgress?: OnProgress;
  onSubmitted?(job: Job): void;
  /** Answer as soon as the job is queued. */
  noWait?: boolean;
}

const flag = (b: boolean | undefined) => (b === undefined ? undefined : String(b));

/** Encrypts files to a stored key or a public key: upload (streamed), wait, download to `outDir`. */
export function encryptFiles(kms: Kms, opts: EncryptOptions): Promise<FileJobResult> {
  if (Boolean(opts.fingerprint) === Boolean(opts.publicKey)) throw new ClientError('unexpected_answer', 'give exactly one of fingerprint and publicKey');
  return fileJob(kms, '/keys/encrypt', { fingerprint: opts.fingerprint, public_key: opts.publicKey, armor: flag(opts.armor), compress: flag(opts.compress) }, opts);
}

/** Decrypts files with a stored key (any generation's fingerprint) and its passphrase. */
export function decryptFiles(kms: Kms, opts: DecryptOptions): Promise<FileJobResult> {
  return fileJob(kms, '/keys/decrypt', { fingerprint: opts.fingerprint, passphrase: opts.passphrase }, opts);
}

/**
 * Brings messages encrypted to an older generation of a key to its current one
 * (`POST /keys/rewrap`: fingerprint, passphrase, files, mode=rewrap|reencrypt).
 */
export function rewrap(kms: Kms, opts: RewrapOptions): Promise<FileJobResult> {
  return fileJob(kms, '/keys/rewrap', { fingerprint: opts.fingerprint, passphrase: opts.passphrase, mode: opts.mode ?? 'rewrap' }, opts);
}

/** Rotates a key now (a rotation job), optionally changing its passphrase; answers the finished job. */
export async function rotate(kms: Kms, opts: RotateOptions): Promise<Job> {
  const wait = Math.min(30, Math.max(0, opts.waitSeconds ?? 2));
  const job = (await kms.data(
    kms.api.POST('/keys/{fingerprint}/rotate', {
      params: { path: { fingerprint: opts.fingerprint } },
      body: { current_passphrase: opts.currentPassphrase, new_passphrase: opts.newPassphrase },
      headers: { 'idempotency-key': opts.idempotencyKey ?? newIdempotencyKey(), ...(wait ? { prefer: `wait=${wait}` } : {}) },
    }),
  )) as Job;
  opts.onSubmitted?.(job);
  return opts.noWait ? job : waitForJob(kms, job, { onProgress: opts.onProgress });
}

async function fileJob(kms: Kms, path: string, fields: Record<string, string | undefined>, opts: FileJobOptions): Promise<FileJobResult> {
  if (!opts.files.length) throw new ClientError('unexpected_answer', 'no files given');
  const outDir = opts.outDir ?? '.';
  const submitted = await submitMultipart(kms, path, fields, opts.files, { idempotencyKey: opts.idempotencyKey, waitSeconds: opts.waitSeconds, onProgress: opts.onProgress });
  opts.onSubmitted?.(submitted);
  const job = isFinished(submitted) && submitted.state === 'completed' ? submitted : await waitForJob(kms, submitted, { onProgress: opts.onProgress });
  if (opts.noDownload) return { job, outputs: [] };
  return { job, outputs: await downloadOutputs(kms, job, { outDir, overwrite: opts.overwrite, onProgress: opts.onProgress }) };
}

/** Downloads every output of a completed job into `outDir`, under the names the job gave them. */
export async function downloadOutputs(kms: Kms, job: Job, opts: { outDir?: string; overwrite?: boolean; onProgress?: OnProgress; only?: number[] } = {}): Promise<Output[]> {
  const outDir = opts.outDir ?? '.';
  await mkdir(outDir, { recursive: true });
  const files = (job.result?.files ?? []).filter((f) => !opts.only || opts.only.includes(f.n));
  const outputs: Output[] = [];
  for (const f of files) {
    // The service already gives base names; basename() again so no answer can write outside outDir.
    const path = join(outDir, basename(f.name) || `output-${f.n}`);
    const size = await downloadJobFile(kms, job.job_id, f, path, { onProgress: opts.onProgress, overwrite: opts.overwrite });
    outputs.push({ n: f.n, name: f.name, size, path });
  }
  return outputs;
}
