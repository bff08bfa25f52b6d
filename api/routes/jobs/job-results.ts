import { z } from 'zod';
import { route } from '../../route';
import { Job } from '../../schemas/job-replies';
import { wholeNumber } from '../../schemas/common';
import { AppError, conflict, gone, notFound } from '../../../lib/errors';
import { arrivingInput, isFinished, jobBlob, jobReadableBy, jobView, jobWithOutputs, watchJobEnd, type JobReader } from '../../../lib/jobs/job-records';
import { readAsPreferred } from '../../job-reply';
import type { JobRow } from '../../../db/jobs';
import { encryptedOutput, EncryptRequest } from '../../../jobs/encrypt-files';
import { FormBoolean } from '../../schemas/key-fields';
import type { AppContext } from '../../context';
import type { Readable } from 'node:stream';
import { notYours } from '../../../lib/auth/ownership';
import type { Container } from '../../../lib/container';
import type { RequestMeta } from '../../../db/audit';
import { BlobNotFoundError } from '../../../lib/blob';
import { release } from '../../../lib/single-use';

const tags = ['Jobs'];
const JobParams = z.object({ job_id: z.uuid() });

async function requireJob(c: Container, reader: JobReader, id: string, meta: RequestMeta) {
  const row = await jobWithOutputs(c, id); // one read tells the caller's job from another's
  if (!row || !jobReadableBy(row, reader)) throw await notYours(c, { userId: reader.id, resource: 'job', target: id, existsElsewhere: Boolean(row), meta });
  return row;
}

export default [
  route({
    method: 'get',
    path: '/jobs/{job_id}',
    summary: 'State, progress, result or error of a job (`Prefer: wait=N` waits up to N ≤ 30 s for it to end)',
    tags,
    access: 'auth',
    scope: 'jobs:read',
    params: JobParams,
    responses: { 200: { description: 'The job', schema: Job } },
    async handler({ c, ctx, user, params, meta }) {
      const row = await readAsPreferred(c, ctx, user.id, params.job_id, () => requireJob(c, user, params.job_id, meta));
      return { body: await jobView(c, row) };
    },
  }),

  route({
    method: 'get',
    path: '/jobs/{job_id}/files/{n}',
    summary: 'Download output file n of a completed job as a stream; `?follow=true` streams the output of a running encrypt job as it is produced',
    tags,
    access: 'auth',
    scope: 'jobs:read',
    params: JobParams.extend({ n: wholeNumber(0, 10_000) }),
    query: z.object({
      follow: FormBoolean.optional().describe(
        'For a queued or running encrypt job: stream the ciphertext while it is produced (chunked, without Content-Length). A queued job is waited for, however long it queues; once it runs, the status and headers come at once. The response ends only when the output is whole; if the job fails it is cut off, never completed (one that fails while still queued is answered 409). Decrypted output is never followed: it is released after its integrity check.',
      ),
    }),
    responses: { 200: { description: 'The file', schema: z.string(), contentType: 'application/octet-stream' } },
    async handler({ c, ctx, user, params, query, meta }) {
      const row = await requireJob(c, user, params.job_id, meta);
      c.jobKeys.admit(row.id, row.data_key); // the blob's key is in the row just read
      if (row.state !== 'completed') {
        if (query.follow && row.kind === 'encrypt' && !isFinished(row.state)) return followOutput(c, ctx, row, params.n);
        const how = row.kind === 'encrypt' && !isFinished(row.state) ? ' Add ?follow=true to stream the ciphertext while it is produced.' : '';
        throw conflict('job_not_completed', `The job is ${row.state}; outputs exist once it has completed.${how}`);
      }
      if (row.purged_at) throw gone('output_expired', 'The outputs of this job have passed their retention and were deleted.');
      const file = row.outputs?.find((f) => f.n === params.n);
      if (!file) throw notFound('file_not_found', `The job has no output file ${params.n}.`);
      let stream;
      try {
        stream = await c.blob.get(jobBlob.output(row.id, file.n));
      } catch (err) {
        if (err instanceof BlobNotFoundError) throw gone('output_expired', 'The outputs of this job were deleted.');
        throw err;
      }
      sendFile(ctx, { name: file.name, contentType: file.content_type, size: file.size }, stream);
    },
  }),
];

/**
 * Sends a job file. Its bytes go to the socket here rather than through koa's `body.pipe(res)`, so that
 * each chunk the blob store hands on single-use (lib/single-use.ts) is released as soon as the socket has
 * written it. A source that fails part-way destroys the response: a client never takes a cut-off file for
 * a whole one.
 */
function sendFile(ctx: AppContext, file: { name: string; contentType: string; size?: number }, source: Readable): void {
  ctx.status = 200;
  ctx.type = file.contentType;
  ctx.set('Content-Disposition', `attachment; filename="${file.name.replace(/[^\x20-\x7e]/g, '_')}"; filename*=UTF-8''${encodeURIComponent(file.name)}`);
  if (file.size !== undefined) ctx.length = file.size;
  ctx.respond = false;
  const res = ctx.res;
  res.once('close', () => source.destroy());
  source.once('error', (err) => {
    if (!res.destroyed) ctx.state.log.warn({ err }, 'a download was cut off');
    res.destroy();
  });
  if (ctx.method === 'HEAD') return void res.end();
  source.on('data', (chunk: Buffer) => {
    const more = res.write(chunk, (err) => {
      if (!err) release(chunk);
    });
    if (!more) source.pause();
  });
  res.on('drain', () => source.resume());
  source.once('end', () => res.end());
}

/**
 * Output n of a running encrypt job, as it is produced. Its input row names it (it may still
 * be uploading: then the input is waited for, as the worker does; a queued job is waited for to start,
 * however long it queues). An error of the follower destroys the
 * response, so a client never takes a cut-off file for a whole one. The job's failure stops the follower
 * at once, also before the output has begun (when no failed marker tells it).
 */
async function followOutput(c: Container, ctx: AppContext, row: JobRow, n: number): Promise<void> {
  const failed = () => conflict('job_not_completed', 'The job failed; outputs exist once it has completed.');
  const abort = new AbortController();
  const watch = await watchJobEnd(c, row.user_id, row.id, (e) => e.type === 'jobs.failed' && abort.abort(failed()));
  ctx.res.once('close', () => {
    watch.stop();
    abort.abort(new Error('the response ended or the client went away'));
  });
  // Read after the watch began: a failure from then on is heard, and one before is seen here.
  const next = await arrivingInput(c, row.id, n, abort.signal, { started: true }).catch((err: unknown) => {
    throw abort.signal.reason instanceof AppError ? abort.signal.reason : err;
  });
  if (next.state === 'failed') throw failed();
  if (!next.file) throw notFound('file_not_found', `The job has no output file ${n}.`);
  const input = next.file;
  // Output n begins once the job has done the earlier ones: up to the job's own time limit.
  const stream = await c.blob.follow(jobBlob.output(row.id, n), {
    signal: abort.signal,
    idleMs: c.config.jobLimits.idleMs,
    startMs: c.config.jobLimits.timeoutMs,
  });
  sendFile(ctx, encryptedOutput(input.name, EncryptRequest.parse(row.request).armor), stream);
  // The job runs: the status and headers go at once, the bytes as the output's segments are published.
  ctx.flushHeaders();
}
