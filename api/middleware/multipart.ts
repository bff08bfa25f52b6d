import busboy from 'busboy';
import type { Readable } from 'node:stream';
import { AppError, invalid, invalidFields, tooLarge } from '../../lib/errors';
import { baseFileName } from '../../lib/file-names';
import type { AppContext } from '../context';

/**
 * Streaming multipart/form-data. Each uploaded file is handed to `store` as a stream as it arrives
 * (straight into the blob store), so the API holds no file in memory or in a temporary folder, and a
 * file over the size limit is refused the moment it crosses it. (koa-body's formidable only checks the
 * per-file limit after the whole part is on disk, which is why uploads do not go through it.)
 */
export interface UploadedFile {
  n: number;
  name: string;
  size: number;
  contentType: string;
}

export interface MultipartOptions {
  /** Form fields that carry the files to store (e.g. `files`). */
  fileFields: string[];
  /** File fields read into memory as text (an armored public key), at most `smallFileBytes`. */
  textFileFields?: string[];
  /**
   * Small binary parts (a key, detached signatures), each read whole (at most `smallFileBytes`), in the
   * order sent; repeatable; a text field of the same name counts as a part too.
   */
  binaryFields?: string[];
  smallFileBytes?: number;
  maxFiles: number;
  maxFileBytes: number;
  store?: (file: UploadedFile, source: Readable) => Promise<{ size: number }>;
  /**
   * Runs once, with the fields sent so far, before the first file is stored: a request that will be
   * refused anyway (unknown key, wrong passphrase) is answered before the client uploads gigabytes.
   */
  beforeFiles?: (fields: Record<string, string>, parts: Record<string, Buffer[]>) => Promise<void>;
  /** Refuse fields sent after the first file (422): they would come too late for `beforeFiles`. */
  fieldsFirst?: boolean;
  /** Aborting ends the form with the signal's reason: what is left of the upload is drained, not stored. */
  signal?: AbortSignal;
}

/**
 * Calls `slow` when the request brings fewer than minBytesPerSecond × windowSeconds bytes within a window
 * of seconds during which it was read: time in which the service held the stream back (a busy blob
 * store) is not the client's and does not count. Answers the function that stops watching.
 */
function watchRate(req: Readable, rate: { minBytesPerSecond: number; windowSeconds: number }, slow: () => void): () => void {
  let bytes = 0;
  let seconds = 0;
  const count = (chunk: Buffer) => (bytes += chunk.length);
  req.on('data', count);
  const timer = setInterval(() => {
    if (req.readableFlowing === false) return;
    if (++seconds < rate.windowSeconds) return;
    if (bytes < rate.minBytesPerSecond * rate.windowSeconds) slow();
    bytes = 0;
    seconds = 0;
  }, 1000);
  timer.unref();
  return () => {
    clearInterval(timer);
    req.off('data', count);
  };
}

export interface MultipartBody {
  fields: Record<string, string>;
  files: UploadedFile[];
  /** The `binaryFields` parts, by field name, in the order sent. */
  parts: Record<string, Buffer[]>;
}

const FIELD_BYTES = 64 * 1024;
/** What a file part may buffer while the blob store is busy: the store then reads it as one larger piece. */
const FILE_HWM = 1 << 20;

/**
 * A text field holding U+0000 is refused as it arrives, as route.ts refuses NUL in every request part:
 * before `beforeFiles` could act on it (a passphrase check would count a wrong guess) and before any upload.
 */
const nulField = (name: string) => invalidFields([{ path: `body.${name}`, message: 'must not contain the NUL character (U+0000)' }]);

export function readMultipart(ctx: AppContext, opts: MultipartOptions): Promise<MultipartBody> {
  if (!ctx.is('multipart/form-data')) {
    return Promise.reject(new AppError(415, 'multipart_required', 'Send this request as multipart/form-data.'));
  }
  const smallMax = opts.smallFileBytes ?? 1 << 20;
  return new Promise<MultipartBody>((resolve, reject) => {
    const fields: Record<string, string> = {};
    const parts: Record<string, Buffer[]> = {};
    const files: UploadedFile[] = [];
    const pending: Promise<unknown>[] = [];
    const streams = new Set<Readable>();
    let checked: Promise<void> | undefined;
    /** Text sent as file parts (a public key) still being read: `beforeFiles` must see them. */
    const texts: Promise<void>[] = [];
    let failed: unknown;
    let bb: busboy.Busboy;
    try {
      bb = busboy({
        headers: ctx.req.headers,
        fileHwm: FILE_HWM,
        // busboy signals `limit` on reaching fileSize, so one byte more lets a file of exactly the limit through.
        limits: {
          fileSize: Math.max(opts.maxFileBytes, smallMax) + 1,
          files: opts.maxFiles + (opts.textFileFields?.length ?? 0) + (opts.binaryFields?.length ?? 0) * Math.max(opts.maxFiles, 1),
          fields: 50,
          fieldSize: FIELD_BYTES,
          parts: 200,
        },
      });
    } catch {
      return reject(invalid('malformed_multipart', 'The multipart body is malformed (boundary missing?).'));
    }
    // The slowest upload taken (UPLOAD_MIN_BYTES_PER_SECOND): a client this slow is not waited for; the
    // answer goes at once and the connection with it.
    const rate = ctx.container.config.uploadRate;
    const unwatch = watchRate(ctx.req, rate, () => {
      ctx.set('Connection', 'close');
      fail(
        new AppError(
          408,
          'upload_too_slow',
          `The upload arrived slower than ${rate.minBytesPerSecond} bytes a second over ${rate.windowSeconds} s; send it again on a faster connection.`,
        ),
      );
    });
    const fail = (err: unknown) => {
      if (failed) return;
      failed = err;
      unwatch();
      ctx.req.unpipe(bb);
      ctx.req.resume(); // drain the rest so the client sees our answer
      // Stop files still streaming and let their stores settle, so the caller's clean-up runs last.
      for (const s of streams) s.destroy(err instanceof Error ? err : undefined);
      void Promise.allSettled(pending).then(() => reject(err instanceof Error ? err : new Error(String(err))));
    };

    const late = (name: string) =>
      opts.fieldsFirst &&
      files.length > 0 &&
      fail(invalid('field_after_files', `Form field "${name}" came after the files: send every other field before the first file.`));

    bb.on('field', (name, value, info) => {
      if (late(name)) return;
      if (info.valueTruncated) return fail(tooLarge('field_too_large', `Form field "${name}" is longer than ${FIELD_BYTES} bytes.`));
      if (opts.binaryFields?.includes(name)) return void (parts[name] ??= []).push(Buffer.from(value, 'utf8'));
      if (value.includes('\u0000')) return fail(nulField(name));
      fields[name] ??= value;
    });

    bb.on('file', (field, stream, info) => {
      if (failed) return stream.resume();
      const binary = opts.binaryFields?.includes(field);
      if (binary || opts.textFileFields?.includes(field)) {
        if (late(field)) return stream.resume();
        // Its place in the order is where it began, not where it ended.
        const slot = binary ? (parts[field] ??= []).push(Buffer.alloc(0)) - 1 : -1;
        const chunks: Buffer[] = [];
        let size = 0;
        stream.on('data', (chunk: Buffer) => {
          size += chunk.length;
          if (size > smallMax) return fail(tooLarge('field_too_large', `"${field}" is larger than ${smallMax} bytes.`));
          chunks.push(chunk);
        });
        texts.push(
          new Promise<void>((resolve) => {
            stream.on('close', resolve);
            stream.on('end', () => {
              if (binary) return void (parts[field][slot] = Buffer.concat(chunks));
              const value = Buffer.concat(chunks).toString('utf8');
              if (value.includes('\u0000')) return fail(nulField(field));
              fields[field] ??= value;
            });
          }),
        );
        return;
      }
      if (!opts.fileFields.includes(field) || !opts.store) {
        stream.resume();
        return fail(invalid('unexpected_file', `Form field "${field}" does not take a file.`));
      }
      if (files.length >= opts.maxFiles) {
        stream.resume();
        return fail(tooLarge('too_many_files', `At most ${opts.maxFiles} files per request.`));
      }
      const n = files.length;
      const file: UploadedFile = { n, name: safeName(info.filename, n), size: 0, contentType: info.mimeType || 'application/octet-stream' };
      files.push(file);
      streams.add(stream);
      stream.on('close', () => streams.delete(stream));
      let clientFailed = false; // the upload itself broke (cut off, malformed), not our side
      stream.on('error', () => (clientFailed = true)); // reported through the store's promise, or by fail()
      stream.on('limit', () => {
        stream.destroy(tooLarge('file_too_large', `"${file.name}" is larger than the limit of ${opts.maxFileBytes} bytes.`));
      });
      const before = opts.beforeFiles;
      checked ??= before ? Promise.all(texts).then(() => before({ ...fields }, parts)) : Promise.resolve();
      const store = opts.store;
      pending.push(
        checked
          .then(() => store(file, stream))
          .then(
            ({ size }) => {
              file.size = size;
            },
            // A broken upload is the client's 400; anything else (storage, integrity) stays what it is.
            (err: unknown) =>
              fail(err instanceof AppError || !clientFailed ? err : new AppError(400, 'upload_interrupted', 'The upload ended before the file was complete.')),
          ),
      );
    });

    bb.on('filesLimit', () => fail(tooLarge('too_many_files', `At most ${opts.maxFiles} files per request.`)));
    bb.on('fieldsLimit', () => fail(tooLarge('too_many_fields', 'Too many form fields.')));
    bb.on('partsLimit', () => fail(tooLarge('too_many_fields', 'Too many form parts.')));
    bb.on('error', () => fail(invalid('malformed_multipart', 'The multipart body is malformed or was cut off.')));
    bb.on('close', () => {
      unwatch();
      Promise.all(pending).then(() => {
        if (!failed) resolve({ fields, files, parts });
      }, fail);
    });
    ctx.req.on('aborted', () => fail(new AppError(400, 'upload_interrupted', 'The client closed the connection during the upload.')));
    opts.signal?.addEventListener('abort', () => fail(opts.signal!.reason), { once: true });
    ctx.req.pipe(bb);
  });
}

/** The name a file is stored and later offered under: the client's base name, without path or control characters. */
function safeName(filename: string | undefined, n: number): string {
  return baseFileName(filename ?? '') ?? `file-${n + 1}`;
}
