import type { Container } from '../lib/container';
import { invalid } from '../lib/errors';
import { jobView, preferWait, waitForJob } from '../lib/services/jobs';
import type { JobRow } from '../db/jobs';
import type { AppContext, Reply } from './route';

/**
 * How every job-submitting endpoint answers: 202 with Location and the job, or, when the client sent
 * `Prefer: wait=N` and the job ended within N seconds, 200 with the finished job.
 */
export async function replyWithJob(c: Container, ctx: AppContext, row: JobRow): Promise<Reply> {
  const wait = preferWait(ctx.get('prefer'));
  const current = wait ? await waitForJob(c, row, wait) : row;
  const body = await jobView(c, current);
  const finished = current.state === 'completed' || current.state === 'failed';
  if (wait !== undefined && finished) return { status: 200, body, headers: { 'Preference-Applied': `wait=${wait}` } };
  return { status: 202, body, headers: { Location: body.status_url } };
}

/** `Idempotency-Key` header: up to 255 visible ASCII characters, or absent. */
export function idempotencyKey(ctx: AppContext): string | undefined {
  const key = ctx.get('idempotency-key');
  if (!key) return undefined;
  if (!/^[\x21-\x7e]{1,255}$/.test(key)) throw invalid('invalid_idempotency_key', 'Idempotency-Key must be 1-255 visible ASCII characters.');
  return key;
}
