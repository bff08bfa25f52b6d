/**
 * Blob store in an S3-compatible bucket, optionally under a key prefix. Writes go through
 * lib-storage's multipart `Upload`, which only completes the upload (making the object visible)
 * after the source ended cleanly, and aborts it otherwise.
 */
import { createReadStream, mkdirSync } from 'node:fs';
import { readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable, addAbortSignal } from 'node:stream';
import {
  AbortMultipartUploadCommand,
  DeleteObjectCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListMultipartUploadsCommand,
  ListObjectsV2Command,
  S3Client,
  type S3ClientConfig,
} from '@aws-sdk/client-s3';
import { Upload } from '@aws-sdk/lib-storage';
import {
  type BlobStore,
  type ByteRange,
  type PutOptions,
  BlobNotFoundError,
  STREAM_CHUNK_BYTES,
  assertValidKey,
  assertValidPrefix,
  assertValidRange,
  byteCounter,
  isValidKey,
} from './types';

const MiB = 1 << 20;

/** Connection and tuning settings; anything left out falls back to the environment (see `s3SettingsFromEnv`). */
export interface S3Settings {
  /** Custom endpoint for S3-compatible stores, e.g. `http://127.0.0.1:9000`. */
  endpoint?: string;
  region?: string;
  accessKeyId?: string;
  secretAccessKey?: string;
  sessionToken?: string;
  /** `bucket` in the path rather than the host name; most S3-compatible stores need it. */
  forcePathStyle?: boolean;
  /** Multipart part size, default 8 MiB. S3 allows 10,000 parts, so this caps an object at ~78 GiB. */
  partSize?: number;
  /** Parts uploaded in parallel, default 2. */
  queueSize?: number;
  /** Where upload parsers write temp files, default `<os tmpdir>/kms-uploads`. Keep it off a small tmpfs. */
  uploadTmpDir?: string;
}

export interface S3BlobStoreOptions extends S3Settings {
  bucket: string;
  /** Key prefix inside the bucket, e.g. `prod/blobs`. */
  prefix?: string;
}

/**
 * Settings from `S3_ENDPOINT`, `S3_REGION` (then `AWS_REGION`, default us-east-1), `AWS_ACCESS_KEY_ID`,
 * `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` and `S3_FORCE_PATH_STYLE` (default: true when an
 * endpoint is set). Without keys the SDK's default chain (profiles, instance roles) applies.
 */
export function s3SettingsFromEnv(env: NodeJS.ProcessEnv = process.env): S3Settings {
  const endpoint = env.S3_ENDPOINT || undefined;
  const pathStyle = env.S3_FORCE_PATH_STYLE?.trim().toLowerCase();
  return {
    endpoint,
    region: env.S3_REGION || env.AWS_REGION || 'us-east-1',
    accessKeyId: env.AWS_ACCESS_KEY_ID || undefined,
    secretAccessKey: env.AWS_SECRET_ACCESS_KEY || undefined,
    sessionToken: env.AWS_SESSION_TOKEN || undefined,
    forcePathStyle: pathStyle ? pathStyle === 'true' || pathStyle === '1' : endpoint !== undefined,
  };
}

export class S3BlobStore implements BlobStore {
  readonly bucket: string;
  readonly uploadTmpDir: string;
  private readonly base: string;
  private readonly client: S3Client;
  private readonly partSize: number;
  private readonly queueSize: number;

  constructor(opts: S3BlobStoreOptions) {
    const prefix = (opts.prefix ?? '').replace(/^\/+|\/+$/g, '');
    if (prefix && !isValidKey(prefix)) throw new TypeError(`invalid S3 key prefix: ${JSON.stringify(opts.prefix)}`);
    this.bucket = opts.bucket;
    this.base = prefix ? `${prefix}/` : '';
    // Memory per put stays bounded at about (queueSize + 2) × partSize: parts in flight, the part being
    // assembled and its concatenation copy. Defaults: ~32 MiB, whatever the object size.
    this.partSize = opts.partSize ?? 8 * MiB;
    this.queueSize = opts.queueSize ?? 2;
    this.uploadTmpDir = opts.uploadTmpDir ?? join(tmpdir(), 'kms-uploads');
    mkdirSync(this.uploadTmpDir, { recursive: true });

    const config: S3ClientConfig = {
      region: opts.region ?? 'us-east-1',
      endpoint: opts.endpoint,
      forcePathStyle: opts.forcePathStyle ?? opts.endpoint !== undefined,
      // No CRC32 on each write and no checksum check on each read (the SDK's defaults): every object is
      // sealed with AES-GCM (lib/blob/sealed.ts), whose tag already fails a changed byte.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
    };
    if (opts.accessKeyId && opts.secretAccessKey) {
      config.credentials = { accessKeyId: opts.accessKeyId, secretAccessKey: opts.secretAccessKey, sessionToken: opts.sessionToken };
    }
    this.client = new S3Client(config);
    // Bodies are signed as UNSIGNED-PAYLOAD, not hashed whole with SHA-256 (~1 CPU-s per GiB) before they
    // are sent: every object is sealed with AES-GCM above this layer, so a body changed on the way (over
    // plain HTTP; TLS otherwise) fails to open on reading, as one changed at rest does.
    this.client.middlewareStack.add(
      (next, context) => async (args) => {
        const request = args.request as { headers?: Record<string, string> };
        if (request.headers && (context.commandName === 'PutObjectCommand' || context.commandName === 'UploadPartCommand')) {
          request.headers['x-amz-content-sha256'] = 'UNSIGNED-PAYLOAD';
        }
        return next(args);
      },
      { step: 'build', name: 'unsignedPayload' },
    );
  }

  async put(key: string, source: Readable, opts: PutOptions = {}): Promise<{ size: number }> {
    const Key = this.keyOf(key);
    const counter = byteCounter(opts.onProgress);
    const body = Readable.from(counter.stage(source), { objectMode: false, highWaterMark: STREAM_CHUNK_BYTES });
    // The first error of the body (a source failure or an abort) is the one worth reporting; the
    // upload may fail later with a secondary error, e.g. while aborting the multipart upload.
    let bodyError: unknown;
    body.on('error', (err) => (bodyError ??= err));
    if (opts.signal) addAbortSignal(opts.signal, body);

    const upload = new Upload({
      client: this.client,
      params: { Bucket: this.bucket, Key, Body: body },
      partSize: this.partSize,
      queueSize: this.queueSize,
      leavePartsOnError: false,
    });
    try {
      await upload.done();
    } catch (err) {
      body.destroy();
      source.destroy();
      throw bodyError ?? err;
    }
    return { size: counter.bytes };
  }

  async putFile(key: string, path: string): Promise<{ size: number }> {
    assertValidKey(key);
    if (!(await stat(path)).isFile()) throw new TypeError(`not a regular file: ${path}`);
    const result = await this.put(key, createReadStream(path, { highWaterMark: STREAM_CHUNK_BYTES }));
    await rm(path, { force: true });
    return result;
  }

  async get(key: string, range?: ByteRange): Promise<Readable> {
    const Key = this.keyOf(key);
    if (range) assertValidRange(range);
    try {
      const res = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key, Range: range && `bytes=${range.start}-${range.end ?? ''}` }));
      if (!(res.Body instanceof Readable)) throw new Error('S3 GetObject returned no Node.js stream body');
      return res.Body;
    } catch (err) {
      throw isNotFound(err) ? new BlobNotFoundError(key) : err;
    }
  }

  async stat(key: string): Promise<{ size: number } | null> {
    const Key = this.keyOf(key);
    try {
      const res = await this.client.send(new HeadObjectCommand({ Bucket: this.bucket, Key }));
      return { size: res.ContentLength ?? 0 };
    } catch (err) {
      if (isNotFound(err)) return null;
      throw err;
    }
  }

  async delete(key: string): Promise<void> {
    const Key = this.keyOf(key);
    try {
      await this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key }));
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
  }

  async deletePrefix(prefix: string): Promise<number> {
    const Prefix = `${this.base}${assertValidPrefix(prefix)}/`;
    let deleted = 0;
    let token: string | undefined;
    // One page lists at most 1000 keys, which is also DeleteObjects' limit.
    do {
      const page = await this.client.send(new ListObjectsV2Command({ Bucket: this.bucket, Prefix, ContinuationToken: token }));
      const objects = (page.Contents ?? []).flatMap((o) => (o.Key ? [{ Key: o.Key }] : []));
      if (objects.length > 0) {
        const res = await this.client.send(new DeleteObjectsCommand({ Bucket: this.bucket, Delete: { Objects: objects, Quiet: true } }));
        const failed = res.Errors ?? [];
        if (failed.length > 0) {
          throw new Error(`could not delete ${failed.length} object(s) under ${prefix}: ${failed[0].Key} ${failed[0].Code} ${failed[0].Message}`);
        }
        deleted += objects.length;
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
    return deleted;
  }

  /**
   * Aborts multipart uploads under our prefix begun before `olderThan` (a crashed writer's parts would
   * otherwise stay, billed and unreadable but not deleted), and removes old files of the upload folder.
   * Buckets should also carry a lifecycle rule for incomplete uploads; this covers stores without one.
   */
  async sweepStale(olderThan: Date): Promise<number> {
    let removed = 0;
    let keyMarker: string | undefined;
    let uploadIdMarker: string | undefined;
    do {
      const page = await this.client
        .send(new ListMultipartUploadsCommand({ Bucket: this.bucket, Prefix: this.base || undefined, KeyMarker: keyMarker, UploadIdMarker: uploadIdMarker }))
        .catch((err: unknown) => {
          // Stores without the listing (s3rver, some gateways) rely on a lifecycle rule instead.
          if ((err as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode === 501)
            return { Uploads: [], IsTruncated: false, NextKeyMarker: undefined, NextUploadIdMarker: undefined };
          throw err;
        });
      for (const upload of page.Uploads ?? []) {
        if (!upload.Key || !upload.UploadId || !upload.Initiated || upload.Initiated >= olderThan) continue;
        await this.client.send(new AbortMultipartUploadCommand({ Bucket: this.bucket, Key: upload.Key, UploadId: upload.UploadId }));
        removed += 1;
      }
      [keyMarker, uploadIdMarker] = page.IsTruncated ? [page.NextKeyMarker, page.NextUploadIdMarker] : [undefined, undefined];
    } while (keyMarker);
    const names = await readdir(this.uploadTmpDir).catch((err: unknown) => {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
      throw err;
    });
    for (const name of names) {
      const path = join(this.uploadTmpDir, name);
      const info = await stat(path).catch(() => null);
      if (info && info.mtime < olderThan) {
        await rm(path, { recursive: true, force: true });
        removed += 1;
      }
    }
    return removed;
  }

  async close(): Promise<void> {
    this.client.destroy();
  }

  private keyOf(key: string): string {
    assertValidKey(key);
    return this.base + key;
  }
}

function isNotFound(err: unknown): boolean {
  // A missing bucket is a configuration error, not a missing object.
  if (!(err instanceof Error) || err.name === 'NoSuchBucket') return false;
  const status = (err as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode;
  return status === 404 || err.name === 'NoSuchKey' || err.name === 'NotFound';
}
