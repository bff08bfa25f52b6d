import { createWriteStream } from 'node:fs';
import { access, rename, rm } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { basename } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import type { components } from './openapi.js';
import { ClientError, JobFailedError, ProblemError } from './errors.js';
import { describe, header, newIdempotencyKey, problemFrom, readText, type Kms } from './http.js';
import { multipartBody, partsOf, type SmallPart, type Upload } from './uploads.js';

export type Job = components['schemas']['Job'];
export type JobFile = components['schemas']['JobFile'];
export type AccountEvent = components['schemas']['Event'];

/** Where a transfer is: `upload` and `download` count bytes moved; `processing` the job's bytes. */
export type Phase = 'upload' | 'queued' | 'processing' | 'download';
export interface Progress {
  phase: Phase;
  bytes_done: number;
  /** Unknown while an upload of streams of unknown size runs, or a job has not said yet. */
  bytes_total?: number;
  /** During a download: the file being written. */
  file?: string;
}
export type OnProgress = (p: Progress) => void;

export interface WaitOptions {
  onProgress?: OnProgress;
  /** Gives up (ClientError `timeout`) after this many seconds. Default: no limit. */
  timeoutSeconds?: number;
  signal?: AbortSignal;
}

export interface SubmitOptions {
  /** Sent with every attempt of this submission; a new one is made when absent. */
  idempotencyKey?: string;
  /** `Prefer: wait=N` (N ≤ 30): the first answer is the finished job when it ends within N s. Default 2. */
  waitSeconds?: number;
  onProgress?: OnProgress;
  /** Small binary parts sent before the files (detached signatures). */
  smallParts?: SmallPart[];
  /** Told the job's id as soon as the service names it (103 Early Hints, asked for with `Prefer: early-hints`), while the upload still runs. */
  onJobId?(jobId: string): void;
}

export const isFinished = (job: Job) => job.state === 'completed' || job.state === 'failed';

/**
 * POSTs a multipart job submission, streaming the files, and answers the job. Network errors and 503
 * are retried with the same Idempotency-Key (the service answers a repeat with the first job, so a
 * submission cut mid-upload and sent again makes one job), 429 after its Retry-After.
 */
export async function submitMultipart(
  kms: Kms,
  path: string,
  fields: Record<string, string | undefined>,
  files: Upload[],
  opts: SubmitOptions = {},
): Promise<Job> {
  const parts = await partsOf(files);
  const body = multipartBody(fields, 'files', parts, opts.smallParts);
  // Progress counts the files' bytes (the multipart framing around them is not theirs), so it ends at their total.
  const fileBytes = parts.every((p) => p.size !== undefined) ? parts.reduce((n, p) => n + p.size!, 0) : undefined;
  const key = opts.idempotencyKey ?? newIdempotencyKey();
  const wait = Math.min(30, Math.max(0, Math.round(opts.waitSeconds ?? 2)));
  return kms.retrying<Job>(async () => {
    let done = 0;
    const report = (n: number) => {
      done += n;
      opts.onProgress?.({ phase: 'upload', bytes_done: done, bytes_total: fileBytes });
    };
    const headers: Record<string, string> = { 'content-type': body.contentType, 'idempotency-key': key, accept: 'application/json' };
    if (body.length !== undefined) headers['content-length'] = String(body.length);
    // Early Hints are asked for only by a caller that listens for them.
    const prefer = [wait ? `wait=${wait}` : '', opts.onJobId ? 'early-hints' : ''].filter(Boolean).join(', ');
    if (prefer) headers.prefer = prefer;
    try {
      const res = await kms.rawRequest('POST', path, headers, body.open(report), {
        onInformation: (status, h) => {
          const id = status === 103 ? monitoredJob(h.link) : undefined;
          if (id) opts.onJobId?.(id);
        },
      });
      if (res.statusCode === 200 || res.statusCode === 202 || res.statusCode === 201) return { ok: JSON.parse(await readText(res)) as Job };
      const problem = await problemFrom(res);
      const decision = kms.classify(problem.status, header(res, 'retry-after'), body.replayable, problem.code);
      if (!decision.retry) throw problem;
      return {
        retry: problem,
        afterMs: decision.afterMs,
        final: () => {
          throw problem;
        },
      };
    } catch (err) {
      if (!(err instanceof ClientError) || err.code !== 'network_error') throw err;
      if (!body.replayable)
        throw new ClientError('not_replayable', `${describe(err)}; the upload was a one-time stream, so it is not sent again.`, { cause: err });
      return {
        retry: err,
        final: () => {
          throw err;
        },
      };
    }
  });
}

/** The job a `Link: </api/v1/jobs/{id}>; rel="monitor"` names (the service's 103 Early Hints; ids are UUIDs). */
function monitoredJob(link: string | string[] | undefined): string | undefined {
  return /<[^>]*\/jobs\/([0-9A-Za-z-]{1,64})>\s*;\s*rel="?monitor"?/.exec([link ?? []].flat().join(', '))?.[1];
}

/** The job as it is now; `waitSeconds` asks the service to hold the answer until it ends (≤ 30 s). */
export async function getJob(kms: Kms, jobId: string, waitSeconds = 0): Promise<Job> {
  return kms.data(
    kms.api.GET('/jobs/{job_id}', { params: { path: { job_id: jobId } }, headers: waitSeconds ? { prefer: `wait=${Math.min(30, waitSeconds)}` } : {} }),
  );
}

const reportJob = (job: Job, onProgress?: OnProgress) => {
  if (!onProgress || isFinished(job)) return;
  onProgress(
    job.state === 'queued'
      ? { phase: 'queued', bytes_done: 0 }
      : { phase: 'processing', bytes_done: job.progress.bytes_done ?? 0, bytes_total: job.progress.bytes_total },
  );
};

/** How long one status request may wait for the job to end (`Prefer: wait`); also how often progress refreshes. */
const LONG_POLL_SECONDS = 2;

/**
 * Waits for a job to end by long polling: `GET /jobs/{id}` with `Prefer: wait=2` answers as soon as the job
 * ends (the service checks every 250 ms at most), else after 2 s with its progress. No race with a job that
 * ends before a listener is set up, and it needs no `events:read` scope. A failed job rejects with
 * JobFailedError.
 */
export async function waitForJob(kms: Kms, jobOrId: Job | string, opts: WaitOptions = {}): Promise<Job> {
  let job = typeof jobOrId === 'string' ? await getJob(kms, jobOrId) : jobOrId;
  const deadline = opts.timeoutSeconds === undefined ? Infinity : Date.now() + opts.timeoutSeconds * 1000;
  while (!isFinished(job)) {
    reportJob(job, opts.onProgress);
    if (Date.now() > deadline) throw new ClientError('timeout', `Job ${job.job_id} is still ${job.state} after ${opts.timeoutSeconds} s.`);
    if (opts.signal?.aborted) throw opts.signal.reason ?? new Error('aborted');
    job = await getJob(kms, job.job_id, LONG_POLL_SECONDS);
  }
  if (job.state === 'failed') throw new JobFailedError(job.job_id, job.error?.code ?? 'job_failed', job.error?.message ?? 'the job failed');
  return job;
}

export interface DownloadOptions {
  onProgress?: OnProgress;
  /** Replace an existing file. Default false: ClientError `output_exists`. */
  overwrite?: boolean;
}

/**
 * Streams output `n` of a job to `dest`: written to `dest.part` and renamed when complete, so a cut
 * download never leaves a partial file under the real name. Network errors and 503 start it again.
 */
export async function downloadJobFile(
  kms: Kms,
  jobId: string,
  file: Pick<JobFile, 'n' | 'name' | 'size'>,
  dest: string,
  opts: DownloadOptions = {},
): Promise<number> {
  await refuseExisting(dest, opts.overwrite);
  const got = await fetchOutput(kms, jobId, file.n, async () => dest, { size: file.size, onProgress: opts.onProgress });
  await rename(got.part, dest).catch(async (err: unknown) => {
    await rm(got.part, { force: true });
    throw err;
  });
  return got.size;
}

/** An output fetched into `part`, to be renamed to `dest` by whoever knows it is whole. */
export interface FetchedOutput {
  n: number;
  dest: string;
  part: string;
  size: number;
}

/**
 * GETs output `n` into `<dest>.part`; `destOf` names `dest` from the response head (a followed output
 * takes its name from Content-Disposition). `size` is checked when given; a followed output has no
 * length, and the service cuts it off when the job fails, which ends here as an error, never as a file.
 * Network errors and 503 start it again, except a followed output's (its caller falls back to the
 * download after the job); on any failure the part file is removed.
 */
export async function fetchOutput(
  kms: Kms,
  jobId: string,
  n: number,
  destOf: (res: IncomingMessage) => Promise<string>,
  opts: { follow?: boolean; size?: number; onProgress?: OnProgress },
): Promise<FetchedOutput> {
  return kms.retrying<FetchedOutput>(
    async () => {
      let part: string | undefined;
      try {
        const res = await kms.rawRequest('GET', `/jobs/${encodeURIComponent(jobId)}/files/${n}${opts.follow ? '?follow=true' : ''}`, {
          accept: 'application/octet-stream, application/problem+json',
        });
        if (res.statusCode !== 200) {
          const problem = await problemFrom(res);
          const decision = kms.classify(problem.status, header(res, 'retry-after'), true);
          if (!decision.retry) throw problem;
          return {
            retry: problem,
            afterMs: decision.afterMs,
            final: () => {
              throw problem;
            },
          };
        }
        const dest = await destOf(res).catch((err: unknown) => {
          res.destroy();
          throw err;
        });
        part = `${dest}.part`;
        let done = 0;
        res.on('data', (chunk: Buffer) => {
          done += chunk.length;
          opts.onProgress?.({ phase: 'download', bytes_done: done, bytes_total: opts.size, file: basename(dest) });
        });
        await pipeline(res, createWriteStream(part, { highWaterMark: 1 << 20, mode: 0o600 }));
        if (opts.size !== undefined && done !== opts.size)
          throw new ClientError('network_error', `Download of ${basename(dest)} ended at ${done} of ${opts.size} bytes.`);
        return { ok: { n, dest, part, size: done } };
      } catch (err) {
        if (part) await rm(part, { force: true });
        if (err instanceof ProblemError) throw err;
        const network = err instanceof ClientError ? err : new ClientError('network_error', describe(err), { cause: err });
        if (network.code !== 'network_error') throw network;
        return {
          retry: network,
          final: () => {
            throw network;
          },
        };
      }
    },
    opts.follow ? 0 : undefined,
  );
}

/** The file name a download's Content-Disposition gives (`filename*` first), or undefined. */
export function dispositionName(res: IncomingMessage): string | undefined {
  const value = header(res, 'content-disposition') ?? '';
  const extended = /filename\*=UTF-8''([^;\s]+)/i.exec(value)?.[1];
  if (extended) {
    try {
      return decodeURIComponent(extended);
    } catch {
      /* malformed: the plain parameter below */
    }
  }
  return /filename="([^"]*)"/i.exec(value)?.[1];
}

const exists = (path: string): Promise<boolean> =>
  access(path).then(
    () => true,
    () => false,
  );

/** Outputs are never written over a file that exists, unless asked. */
export async function refuseExisting(dest: string, overwrite = false): Promise<void> {
  if (!overwrite && (await exists(dest))) throw new ClientError('output_exists', `${dest} exists (use overwrite to replace it).`, { path: dest });
}

export interface FollowOptions {
  types?: string[];
  /** Resume after this event id (replays what was missed). */
  lastEventId?: string;
  signal?: AbortSignal;
  /** Reconnect (with Last-Event-ID) when the stream drops. Default true. */
  reconnect?: boolean;
}

/**
 * The account's events from GET /events (Server-Sent Events), as they happen. With `reconnect`, a
 * dropped stream is opened again after the service's `retry` advice, resuming from the last id seen.
 */
export async function* followEvents(kms: Kms, opts: FollowOptions = {}): AsyncGenerator<AccountEvent> {
  let last = opts.lastEventId;
  let retryMs = 3000;
  const query = opts.types?.length ? `?types=${encodeURIComponent(opts.types.join(','))}` : '';
  for (;;) {
    try {
      const res = await kms.rawRequest('GET', `/events${query}`, { accept: 'text/event-stream', ...(last ? { 'last-event-id': last } : {}) }, undefined, {
        idleMs: 60_000,
        signal: opts.signal,
      });
      if (res.statusCode !== 200) throw await problemFrom(res);
      res.setEncoding('utf8');
      let buffer = '';
      for await (const chunk of res) {
        buffer += chunk as string;
        for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
          const frame = parseFrame(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
          if (frame.retry) retryMs = frame.retry;
          if (frame.id) last = frame.id;
          if (frame.data && frame.event !== 'gap') yield JSON.parse(frame.data) as AccountEvent;
        }
      }
    } catch (err) {
      if (opts.signal?.aborted || err instanceof ProblemError || opts.reconnect === false) throw err;
    }
    if (opts.reconnect === false || opts.signal?.aborted) return;
    await sleep(retryMs, undefined, { signal: opts.signal }).catch(() => undefined);
    if (opts.signal?.aborted) return;
  }
}

function parseFrame(text: string): { id?: string; event?: string; data?: string; retry?: number } {
  const frame: { id?: string; event?: string; data?: string; retry?: number } = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith(':')) continue;
    const at = line.indexOf(':');
    const field = at < 0 ? line : line.slice(0, at);
    const value = at < 0 ? '' : line.slice(at + 1).replace(/^ /, '');
    if (field === 'data') frame.data = frame.data === undefined ? value : `${frame.data}\n${value}`;
    else if (field === 'id') frame.id = value;
    else if (field === 'event') frame.event = value;
    else if (field === 'retry' && /^\d+$/.test(value)) frame.retry = Number(value);
  }
  return frame;
}
