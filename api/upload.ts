import type { Container } from '../lib/container';
import { jobBlob, newJobId, recordInputFile } from '../lib/jobs/job-records';
import { fingerprintAsRead } from '../lib/upload-fingerprint';
import { readMultipart, type MultipartOptions, type UploadedFile } from './middleware/multipart';
import type { AppContext } from './context';

/** An uploaded file as stored; `fingerprint` (lib/upload-fingerprint.ts) only when the request carries an Idempotency-Key (else ''). */
interface StoredFile extends UploadedFile {
  fingerprint: string;
}

/**
 * The files of a job submission (multipart field `files`), stored as the inputs of job `id` while that
 * job already runs. The route's handler runs at the first file part, with the fields sent
 * before it (the form documents that files come last); it records and enqueues the job, then calls
 * `begin`. Only then are the files stored, each one's input row written as it starts so that the worker
 * can follow it; `files()` settles when the whole form has been read.
 */
export interface Upload {
  id: string;
  /** The job's data key, sealed for its row (lib/blob/data-keys.ts): the files are sealed under it. */
  dataKey: string;
  /** The small binary parts sent before the files (the route's `binaryFields`), by name, in order. */
  parts: Record<string, Buffer[]>;
  /** A file part arrived, so the handler runs while the files stream in. */
  streaming: boolean;
  /**
   * Lets the files be stored as job `id`'s inputs; or, for a replay, only fingerprinted and dropped: under
   * the key of the job it repeats (`replayOf`) when that job has one (it had files), else under this
   * upload's own (the request cannot match then).
   */
  begin(asJob: true): void;
  begin(asJob: false, replayOf?: string): void;
  /** The stored files once the form has been read; rejects with the upload's error. */
  files(): Promise<StoredFile[]>;
  /** Ends the upload early (its job ended): `files()` rejects with `reason`, the rest is drained, not stored. */
  stop(reason: Error): void;
}

type Handler<R> = (fields: Record<string, string>, upload: Upload) => Promise<R>;

/**
 * Reads a multipart job submission. `handle` runs once: at the first file part (the files wait for its
 * `begin`), or after the form when it holds no file. Its answer is the request's answer; an error it
 * throws before `begin` stops the upload (the client is answered before it sends gigabytes).
 */
export async function receiveUpload<R>(
  ctx: AppContext,
  c: Container,
  opts: Pick<MultipartOptions, 'textFileFields' | 'binaryFields'> & {
    precheck?(fields: Record<string, string>, parts: Record<string, Buffer[]>): Promise<void>;
  },
  handle: Handler<R>,
): Promise<R> {
  const fingerprinted = Boolean(ctx.get('idempotency-key'));
  const fingerprints = new Map<number, string>();
  let asJob = false;
  /** The job whose data key the files' fingerprints are made under: this one, or the one a replay repeats. */
  let fingerprintJob = '';
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  let handled: Promise<R> | undefined;
  const stopped = new AbortController();
  const id = newJobId();
  const upload: Upload = {
    id,
    dataKey: c.jobKeys.mint(id),
    parts: {},
    streaming: false,
    begin(job: boolean, replayOf?: string) {
      asJob = job;
      fingerprintJob = replayOf ?? id;
      release();
    },
    files: () => form.then((f) => f.files.map((file) => ({ ...file, fingerprint: fingerprints.get(file.n) ?? '' }))),
    stop: (reason) => stopped.abort(reason),
  };
  const form = readMultipart(ctx, {
    fileFields: ['files'],
    textFileFields: opts.textFileFields,
    binaryFields: opts.binaryFields,
    maxFiles: c.config.limits.maxFilesPerJob,
    maxFileBytes: c.config.limits.maxFileBytes,
    fieldsFirst: true,
    signal: stopped.signal,
    async beforeFiles(fields, parts) {
      upload.parts = parts;
      await opts.precheck?.(fields, parts);
      upload.streaming = true;
      handled = handle(fields, upload);
      // A handler that ends before `begin` (an error) must stop the upload, not wait for it.
      await Promise.race([released, handled.then(() => Promise.reject(new Error('the job handler ended before storing the upload')))]);
    },
    async store(file, source) {
      // The input is recorded (and so followed by the worker) once its put has opened: a follower never
      // waits for a file whose put could still fail to begin.
      const onOpen = asJob ? () => recordInputFile(c, upload.id, { n: file.n, name: file.name, content_type: file.contentType }) : undefined;
      // The fingerprint is only ever compared on an Idempotency-Key replay: without the header it is not made.
      if (fingerprinted) fingerprintAsRead(source, await c.jobKeys.get(fingerprintJob), file.n, (hex) => fingerprints.set(file.n, hex));
      return c.blob.put(jobBlob.input(upload.id, file.n), source, { onOpen, fresh: true });
    },
  });
  try {
    const read = await form.then(
      (f) => f,
      (err: unknown) => {
        if (!handled) throw err;
      },
    );
    // The handler has seen the upload's end (or its error) through files(): its answer is the answer.
    if (handled) return await handled;
    upload.parts = read!.parts;
    return await handle(read!.fields, upload);
  } finally {
    // Uploads that did not become a job (invalid form, refused key, replayed request) are dropped. One
    // that did stays with its job (`begin(true)` comes only once the job is recorded and enqueued).
    if (!asJob) await c.blob.deletePrefix(jobBlob.dir(upload.id)).catch(() => undefined);
    c.jobKeys.release(upload.id);
  }
}
