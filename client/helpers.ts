import { mkdir, open, rename, rm } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { basename, join } from 'node:path';
import { ClientError } from './errors.js';
import { newIdempotencyKey, type Kms } from './http.js';
import {
  dispositionName,
  downloadJobFile,
  fetchOutput,
  refuseExisting,
  isFinished,
  submitMultipart,
  waitForJob,
  type FetchedOutput,
  type Job,
  type JobFile,
  type OnProgress,
} from './jobs.js';
import { uploadName, type Upload } from './uploads.js';

interface FileJobOptions {
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
  /**
   * Download each ciphertext while the job produces it (`?follow=true`, from the moment the service
   * names the job, while the upload still runs), and keep it only once the job has completed with
   * exactly those bytes. Default true; false downloads after the job.
   */
  follow?: boolean;
  /** A stored key, by any generation's fingerprint; or */
  fingerprint?: string;
  /** an armored public key (the text), e.g. someone's gpg key. */
  publicKey?: string;
  /** ASCII armor (`.asc`) instead of binary (`.gpg`). */
  armor?: boolean;
  compress?: boolean;
  /** Sign and encrypt: a key of yours (its current generation signs) and its passphrase. */
  signWith?: { fingerprint: string; passphrase: string };
}

export interface DecryptOptions extends FileJobOptions {
  fingerprint: string;
  passphrase: string;
  /** Decrypt and verify: a stored key whose signatures are checked (`job.result.signatures`). */
  verifyWith?: string;
  /** With verifyWith: a file without a valid signature fails the job (no plaintext). */
  requireSignature?: boolean;
}

export interface VerifyOptions extends Omit<FileJobOptions, 'outDir' | 'overwrite' | 'noDownload'> {
  /** A stored key (any of its generations may have signed); or */
  fingerprint?: string;
  /** the signer's armored public key. */
  publicKey?: string;
  /** Detached signatures, one per file in the same order; none: the files are signed messages. */
  signatures?: Buffer[];
}

export interface SignOptions extends FileJobOptions {
  fingerprint: string;
  passphrase: string;
  /** Detached signatures (default) or signed messages. */
  detached?: boolean;
  armor?: boolean;
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
  /** Moves the key to this OpenPGP profile (this generation and the later ones). */
  profile?: 'rfc4880' | 'rfc9580' | 'pqc';
  idempotencyKey?: string;
  waitSeconds?: number;
  onProgress?: OnProgress;
  onSubmitted?(job: Job): void;
  /** Answer as soon as the job is queued. */
  noWait?: boolean;
}

const flag = (b: boolean | undefined) => (b === undefined ? undefined : String(b));

/**
 * Encryptions and rewraps name each output after its input: two inputs of one name (from two folders) would
 * make two outputs of one name in outDir. Said before anything is uploaded. (A decryption's outputs take the
 * names the messages carry: those are checked once the job has them, in downloadOutputs.)
 */
function refuseSameNames(opts: FileJobOptions): void {
  if (opts.noDownload) return;
  const names = opts.files.map(uploadName);
  const twice = firstRepeat(names);
  if (twice)
    throw new ClientError(
      'output_exists',
      `Two files are named "${names[twice[1]]}": their outputs would have one name in ${opts.outDir ?? '.'} (rename one, or send them in separate jobs).`,
    );
}

/**
 * Refuses (ClientError `output_exists`, naming the first) outputs that exist, all of them before the first
 * byte is moved: the one check of every helper that writes files, so none uploads, runs a job or
 * downloads half its outputs to stop at one that exists.
 */
export async function refuseExistingOutputs(paths: Iterable<string>, overwrite = false): Promise<void> {
  if (overwrite) return;
  for (const path of paths) await refuseExisting(path, false);
}

/** The name the service gives an input's output, when the request and the input say it: undefined when only the job knows. */
type OutputName = (input: Upload) => Promise<string | undefined>;

/** `report.pdf.gpg` → `report.pdf`, as the service names a decryption of a message that names no file (and as `kms encrypt`'s messages name it). */
const withoutPgpExtension = (name: string) => name.replace(/\.(gpg|pgp|asc)$/i, '') || name;

/** Whether a file is an ASCII-armored message, as the service decides it: its first octet that is not white space is `-`. */
async function isArmored(input: Upload): Promise<boolean | undefined> {
  const path = typeof input === 'string' ? input : 'path' in input ? input.path : undefined;
  if (!path) return undefined;
  const fh = await open(path, 'r');
  try {
    const { buffer, bytesRead } = await fh.read({ buffer: Buffer.alloc(1024), position: 0 });
    const first = buffer.subarray(0, bytesRead).toString('latin1').trimStart();
    return first ? first.startsWith('-') : undefined;
  } finally {
    await fh.close();
  }
}

/**
 * The outputs a file job will write, refused before the upload when they exist. Named by the service
 * from the request (encrypt, sign), from the input (rewrap: armored in, armored out) or, for a
 * decryption, from the file name inside the message, which only the job reads: there the name the
 * service falls back on is checked first, and the name the message gives again before the download.
 */
async function refuseExistingBeforeUpload(opts: FileJobOptions, nameOf: OutputName): Promise<void> {
  if (opts.noDownload || opts.overwrite) return;
  const names = await Promise.all(opts.files.map(nameOf));
  await refuseExistingOutputs(names.flatMap((name, n) => (name === undefined ? [] : [outputPath(opts.outDir ?? '.', name, n)])));
}

/** The indices of the first value that occurs twice (its first place, then the second), if any. */
function firstRepeat<T>(values: T[]): [number, number] | undefined {
  const second = values.findIndex((v, i) => values.indexOf(v) !== i);
  return second < 0 ? undefined : [values.indexOf(values[second]), second];
}

/** Encrypts files to a stored key or a public key: upload (streamed), wait, download to `outDir`. */
export async function encryptFiles(kms: Kms, opts: EncryptOptions): Promise<FileJobResult> {
  if (Boolean(opts.fingerprint) === Boolean(opts.publicKey)) throw new ClientError('unexpected_answer', 'Give exactly one of fingerprint and publicKey.');
  refuseSameNames(opts);
  await refuseExistingBeforeUpload(opts, async (f) => `${uploadName(f)}${opts.armor ? '.asc' : '.gpg'}`);
  const signing = { sign_with: opts.signWith?.fingerprint, passphrase: opts.signWith?.passphrase };
  return fileJob(
    kms,
    '/keys/encrypt',
    { fingerprint: opts.fingerprint, public_key: opts.publicKey, armor: flag(opts.armor), compress: flag(opts.compress), ...signing },
    opts,
    opts.follow !== false,
  );
}

/** Decrypts files with a stored key (any generation's fingerprint) and its passphrase; optionally verifies their signatures. */
export async function decryptFiles(kms: Kms, opts: DecryptOptions): Promise<FileJobResult> {
  await refuseExistingBeforeUpload(opts, async (f) => withoutPgpExtension(uploadName(f)));
  return fileJob(
    kms,
    '/keys/decrypt',
    { fingerprint: opts.fingerprint, passphrase: opts.passphrase, verify_with: opts.verifyWith, require_signature: flag(opts.requireSignature) },
    opts,
  );
}

/** Verifies signatures (no outputs): the job's `result.signatures` has each file's verdict. */
export async function verifyFiles(kms: Kms, opts: VerifyOptions): Promise<Job> {
  if (Boolean(opts.fingerprint) === Boolean(opts.publicKey)) throw new ClientError('unexpected_answer', 'give exactly one of fingerprint and publicKey');
  const smallParts = (opts.signatures ?? []).map((data, n) => ({ field: 'signatures', name: `signature-${n + 1}.sig`, data }));
  const submitted = await submitMultipart(kms, '/keys/verify', { fingerprint: opts.fingerprint, public_key: opts.publicKey }, opts.files, {
    idempotencyKey: opts.idempotencyKey,
    waitSeconds: opts.waitSeconds,
    onProgress: opts.onProgress,
    smallParts,
  });
  opts.onSubmitted?.(submitted);
  return waitForJob(kms, submitted, { onProgress: opts.onProgress });
}

/** Signs files with a stored key's current generation: detached signatures (`.sig`, `.asc` armored) or signed messages. */
export async function signFiles(kms: Kms, opts: SignOptions): Promise<FileJobResult> {
  refuseSameNames(opts);
  const extension = opts.armor ? '.asc' : opts.detached === false ? '.gpg' : '.sig';
  await refuseExistingBeforeUpload(opts, async (f) => `${uploadName(f)}${extension}`);
  return fileJob(
    kms,
    '/keys/sign',
    { fingerprint: opts.fingerprint, passphrase: opts.passphrase, detached: flag(opts.detached), armor: flag(opts.armor) },
    opts,
  );
}

/**
 * Brings messages encrypted to an older generation of a key to its current one
 * (`POST /keys/rewrap`: fingerprint, passphrase, files, mode=rewrap|reencrypt).
 */
export async function rewrap(kms: Kms, opts: RewrapOptions): Promise<FileJobResult> {
  refuseSameNames(opts);
  await refuseExistingBeforeUpload(opts, async (f) => {
    const armored = await isArmored(f);
    return armored === undefined ? undefined : `${withoutPgpExtension(uploadName(f))}${armored ? '.asc' : '.gpg'}`;
  });
  return fileJob(kms, '/keys/rewrap', { fingerprint: opts.fingerprint, passphrase: opts.passphrase, mode: opts.mode ?? 'rewrap' }, opts);
}

/** Rotates a key now (a rotation job), optionally changing its passphrase and profile; answers the finished job. */
export async function rotate(kms: Kms, opts: RotateOptions): Promise<Job> {
  const wait = Math.min(30, Math.max(0, opts.waitSeconds ?? 2));
  const job = await kms.data<Job>(
    kms.api.POST('/keys/{fingerprint}/rotate', {
      params: { path: { fingerprint: opts.fingerprint } },
      body: { current_passphrase: opts.currentPassphrase, new_passphrase: opts.newPassphrase, profile: opts.profile },
      headers: { 'idempotency-key': opts.idempotencyKey ?? newIdempotencyKey(), ...(wait ? { prefer: `wait=${wait}` } : {}) },
    }),
  );
  opts.onSubmitted?.(job);
  return opts.noWait ? job : waitForJob(kms, job, { onProgress: opts.onProgress });
}

async function fileJob(kms: Kms, path: string, fields: Record<string, string | undefined>, opts: FileJobOptions, follow = false): Promise<FileJobResult> {
  if (!opts.files.length) throw new ClientError('unexpected_answer', 'No files given.');
  const outDir = opts.outDir ?? '.';
  // One progress bar at a time: the upload's, then the job's until the followed download's bytes flow.
  let uploading = true;
  let downloading = false;
  let followed: Followed | undefined;
  const startFollowing =
    follow && !opts.noDownload
      ? (jobId: string) => {
          followed ??= followOutputs(kms, jobId, opts.files.length, outDir, {
            overwrite: opts.overwrite,
            onProgress: (p) => uploading || ((downloading = true), opts.onProgress?.(p)),
          });
        }
      : undefined;
  let job: Job;
  try {
    const submitted = await submitMultipart(kms, path, fields, opts.files, {
      idempotencyKey: opts.idempotencyKey,
      waitSeconds: opts.waitSeconds,
      onProgress: opts.onProgress,
      onJobId: startFollowing,
    });
    uploading = false;
    opts.onSubmitted?.(submitted);
    // No 103 Early Hints reached us (a proxy may drop them): follow from the answer.
    if (!isFinished(submitted)) startFollowing?.(submitted.job_id);
    job =
      isFinished(submitted) && submitted.state === 'completed'
        ? submitted
        : await waitForJob(kms, submitted, { onProgress: (p) => downloading || opts.onProgress?.(p) });
  } catch (err) {
    await followed?.discard();
    throw err;
  }
  if (opts.noDownload) return { job, outputs: [] };
  const kept = await followed?.keep(job);
  return { job, outputs: kept ?? (await downloadOutputs(kms, job, { outDir, overwrite: opts.overwrite, onProgress: opts.onProgress })) };
}

/** Outputs downloaded while the job produced them, waiting for the job's verdict. */
interface Followed {
  /** Once the downloads have ended: the outputs under their names if they are exactly the completed job's (else undefined, parts removed). */
  keep(job: Job): Promise<Output[] | undefined>;
  discard(): Promise<void>;
}

/**
 * Follows outputs 0 … count-1 of a running encryption, one after another, each into `<name>.part`
 * (the name from the answer's Content-Disposition). Nothing gets its real name before the job has
 * completed and its result lists the same names and sizes: a failed job cuts the download off. Any
 * failure or mismatch (a cut connection, a job queued longer than a request may stay silent, a retried
 * submission that made another job) falls back to downloading the outputs after the job, which retries.
 */
function followOutputs(kms: Kms, jobId: string, count: number, outDir: string, opts: { overwrite?: boolean; onProgress?: OnProgress }): Followed {
  const got: FetchedOutput[] = [];
  // Whether every output was fetched (false once one failed).
  const done = (async () => {
    await mkdir(outDir, { recursive: true });
    for (let n = 0; n < count; n++) {
      const destOf = async (res: IncomingMessage) => {
        const dest = outputPath(outDir, dispositionName(res), n);
        // Two outputs of one name (the service named them so: same-named inputs are refused before the
        // upload) fall back to the download after the job, which refuses them by name.
        if (got.some((f) => f.dest === dest)) throw new ClientError('output_exists', `Two outputs of job ${jobId} are named ${basename(dest)}.`);
        await refuseExisting(dest, opts.overwrite);
        return dest;
      };
      got.push(await fetchOutput(kms, jobId, n, destOf, { follow: true, onProgress: opts.onProgress }));
    }
  })().then(
    () => true,
    () => false,
  );
  const discard = async () => {
    await done;
    await Promise.all(got.map((f) => rm(f.part, { force: true })));
  };
  return {
    discard,
    async keep(job) {
      const whole = await done;
      const files = job.result?.files ?? [];
      const fetched = new Map(got.map((f) => [f.n, f]));
      const same = (f: JobFile) => fetched.get(f.n)?.size === f.size && fetched.get(f.n)!.dest === outputPath(outDir, f.name, f.n);
      if (!whole || job.job_id !== jobId || files.length !== got.length || !files.every(same)) {
        await discard();
        return undefined;
      }
      try {
        for (const f of got) await rename(f.part, f.dest);
      } catch (err) {
        await discard();
        throw err;
      }
      return files.map((f) => ({ n: f.n, name: f.name, size: f.size, path: fetched.get(f.n)!.dest }));
    },
  };
}

/**
 * Where output n goes: its name's last part, inside `outDir` whatever the answer says (the service gives
 * base names already; `..`, `.` or nothing become `output-<n>`).
 */
function outputPath(outDir: string, name: string | undefined, n: number): string {
  const base = basename(name ?? '');
  return join(outDir, base === '' || base === '.' || base === '..' ? `output-${n}` : base);
}

/** Downloads every output of a completed job into `outDir`, under the names the job gave them. */
export async function downloadOutputs(
  kms: Kms,
  job: Job,
  opts: { outDir?: string; overwrite?: boolean; onProgress?: OnProgress; only?: number[] } = {},
): Promise<Output[]> {
  // A queued or running job lists no outputs yet: say so rather than download nothing.
  if (job.state !== 'completed')
    throw new ClientError('job_not_completed', `Job ${job.job_id} is ${job.state}: its outputs exist once it has completed (wait for it first).`);
  const outDir = opts.outDir ?? '.';
  const files = (job.result?.files ?? []).filter((f) => !opts.only || opts.only.includes(f.n));
  const paths = files.map((f) => outputPath(outDir, f.name, f.n));
  // Two outputs of one name: the second would replace the first (with `overwrite`) or stop half-way.
  const twice = firstRepeat(paths);
  if (twice) {
    const [first, second] = twice;
    throw new ClientError(
      'output_exists',
      `Outputs ${files[first].n} and ${files[second].n} of job ${job.job_id} are both named ${basename(paths[second])}: download them one at a time into separate folders (\`only\`; kms jobs download --file N --out DIR).`,
    );
  }
  await refuseExistingOutputs(paths, opts.overwrite);
  await mkdir(outDir, { recursive: true });
  const outputs: Output[] = [];
  for (const [i, f] of files.entries()) {
    const path = paths[i];
    const size = await downloadJobFile(kms, job.job_id, f, path, { onProgress: opts.onProgress, overwrite: opts.overwrite });
    outputs.push({ n: f.n, name: f.name, size, path });
  }
  return outputs;
}
