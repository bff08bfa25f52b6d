import { Readable } from 'node:stream';
import type { Container } from '../lib/container';
import { AppError, tooLarge } from '../lib/errors';
import { integrityFailure } from '../lib/pgp/integrity';
import { ONE_PIECE, counted } from '../lib/streams';
import { arrivingInput, jobBlob } from '../lib/jobs/job-records';
import { UnrecoverableError } from 'bullmq';
import { type JobFileRow, type JobProgress, type JobRow, type NextInput, type OutputFile } from '../db/jobs';
import type { Progress } from './tracked';
import type { Slot } from '../lib/slots';
import { Watchdog } from './watchdog';

export interface Transformed {
  stream: Readable;
  name: string;
  contentType: string;
}

export interface FilesDone {
  inputs: JobFileRow[];
  outputs: OutputFile[];
  bytesTotal: number;
  progress: JobProgress;
  /** Deletes the uploads (plaintext, for encryption) once the job's completion is committed. */
  deleteInputs: () => Promise<void>;
}

/**
 * Streams each input blob of a job through `transform` into its output blob, one file at a time,
 * reporting input bytes as progress. The job may start while its upload still arrives (api/upload.ts):
 * input n is followed as it is written, and the inputs end when the upload has (`uploaded_at`).
 * Outputs are written so that readers can follow them too, but they are whole only once their stream
 * ended without error (a decryption's, after its integrity check).
 * While it waits for upload bytes (the next file, the next piece of one) the job gives `slot` back.
 * When `signal` aborts (the job passed its limits), the input is destroyed and the output put abandoned,
 * so nothing keeps reading for a job that has already failed. All outputs together may not exceed
 * MAX_JOB_OUTPUT_BYTES (decompression bombs spread over many files). A transform that answers null
 * has read its input to the end itself and has no output (a verification).
 */
export async function transformFiles(
  c: Container,
  job: Pick<JobRow, 'id' | 'attempts'> & { firstInput?: NextInput },
  progress: Progress,
  { signal, slot }: { signal: AbortSignal; slot: Slot },
  transform: (source: Readable, file: JobFileRow) => Promise<Transformed | null>,
): Promise<FilesDone> {
  const inputs: JobFileRow[] = [];
  const outputs: OutputFile[] = [];
  const jobId = job.id;
  // No output of this job exists before its first attempt (the row counts attempts as they start).
  const fresh = job.attempts === 1;
  const quota = { left: c.config.limits.maxJobOutputBytes };
  let before = 0;
  // The last input is known as such once the upload has ended: no look for one after it.
  for (
    let next = await nextFile(c, jobId, 0, signal, slot, job.firstInput);
    next.file;
    next = next.last ? {} : await nextFile(c, jobId, inputs.length, signal, slot)
  ) {
    const { file } = next;
    let read = 0;
    // Its row exists, so its put has opened: a file not there was deleted with a job the API failed.
    const input = await c.blob.follow(jobBlob.input(jobId, file.n), { signal, idleMs: c.config.jobLimits.idleMs, begun: true, slot });
    const source = counted(input, (n) => {
      read = n;
      progress.report({ bytes_done: before + n });
    });
    const release = () => source.destroy(signal.reason as Error);
    signal.addEventListener('abort', release, { once: true });
    try {
      const out = await transform(source, file);
      if (out) {
        // A put that fails before it reads (no data key, a storage error) leaves the output unread: it is
        // destroyed with its input, or its own later error (the input gone) would have no listener.
        const { size } = await c.blob.put(jobBlob.output(jobId, file.n), withinQuota(out.stream, quota), { signal, fresh }).catch((err: unknown) => {
          out.stream.destroy();
          source.destroy();
          throw err;
        });
        outputs.push({ n: file.n, name: out.name, size, content_type: out.contentType });
      }
    } finally {
      signal.removeEventListener('abort', release);
    }
    before += read;
    inputs.push({ ...file, size: read });
    progress.report({ bytes_done: before, files_done: inputs.length });
  }
  return {
    inputs,
    outputs,
    bytesTotal: before,
    progress: { bytes_done: before, bytes_total: before, files_done: inputs.length, files_total: inputs.length },
    // All inputs at once: one walk of the folder, not each file's markers read first to find its segments.
    deleteInputs: async () => void (await c.blob.deletePrefix(jobBlob.inputs(jobId))),
  };
}

/** Input n of the job (none when the upload has ended with fewer files), and whether it is the last; `known`: as the job's start read it. */
async function nextFile(
  c: Container,
  jobId: string,
  n: number,
  signal: AbortSignal,
  slot: Slot,
  known?: NextInput,
): Promise<{ file?: JobFileRow; last?: boolean }> {
  const next = await Watchdog.awaitingUpload(signal, arrivingInput(c, jobId, n, signal, { slot, keptEnd: true, known }));
  await slot.acquire(signal);
  if (next.file || next.uploaded) return { file: next.file, last: next.inputs === n + 1 };
  // The API failed the job (its upload broke): nothing more comes, and the row says why.
  throw new UnrecoverableError(`the upload of job ${jobId} failed`);
}

/**
 * For jobs that decrypt: while a file's plaintext has not ended (verified), the job's own limits (its
 * signal's reason: the deadline, the no-progress limit; and MAX_JOB_OUTPUT_BYTES) answer as any failure
 * once decrypting does (lib/pgp/integrity.ts): how far unverified plaintext got, or how large it
 * decompressed, must not show. `failAs` goes to the tracked job's `failAs`; `begin` is called before a
 * file's decryption starts and `decrypted` with its plaintext stream.
 */
export function decryptionLimits(signal: AbortSignal) {
  let decrypting = false;
  return {
    failAs: (err: unknown) => (decrypting && err instanceof AppError && (err === signal.reason || err.code === OUTPUT_TOO_LARGE) ? integrityFailure() : err),
    begin: () => void (decrypting = true),
    decrypted<T extends Readable>(plaintext: T): T {
      plaintext.once('end', () => (decrypting = false));
      return plaintext;
    },
  };
}

const OUTPUT_TOO_LARGE = 'job_output_too_large';

function withinQuota(stream: Readable, quota: { left: number }): Readable {
  async function* limit(): AsyncGenerator<Buffer> {
    for await (const chunk of stream) {
      quota.left -= (chunk as Buffer).length;
      if (quota.left < 0) throw tooLarge(OUTPUT_TOO_LARGE, 'The outputs of this job exceed the per-job limit (MAX_JOB_OUTPUT_BYTES).');
      yield chunk as Buffer;
    }
  }
  return Readable.from(limit(), ONE_PIECE);
}
