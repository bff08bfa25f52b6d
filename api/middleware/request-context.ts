import { randomUUID } from 'node:crypto';
import type { Next } from 'koa';
import type { AppContext } from '../context';
import type { RequestMeta } from '../../db/audit';

const SAFE_ID = /^[A-Za-z0-9._-]{1,128}$/;

/** What audit rows (and jobs) record of a request: its client address and id. */
export const requestMeta = (ctx: AppContext): RequestMeta => ({ ip: ctx.ip, requestId: ctx.state.requestId });

/**
 * Request id (taken from X-Request-Id when sane, else new), a child logger carrying it, safe default
 * headers, one access-log line and the request metrics. Both name the matched route template, not the
 * raw path, since some paths carry share tokens (and templates keep the metrics' label set bounded).
 */
export async function requestContext(ctx: AppContext, next: Next) {
  const started = process.hrtime.bigint();
  const incoming = ctx.get('x-request-id');
  const requestId = SAFE_ID.test(incoming) ? incoming : randomUUID();
  ctx.state.requestId = requestId;
  ctx.state.log = ctx.container.log.child({ request_id: requestId });
  ctx.set('X-Request-Id', requestId);
  ctx.set('X-Content-Type-Options', 'nosniff');
  ctx.set('Cache-Control', 'no-store');
  try {
    await next();
  } finally {
    const route = (ctx as unknown as { _matchedRoute?: string })._matchedRoute ?? '(unmatched)';
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    const labels = { method: ctx.method, route, status: String(ctx.status) };
    ctx.container.metrics.httpRequests.inc(labels);
    ctx.container.metrics.httpDuration.observe(labels, seconds);
    ctx.state.log.info({ method: ctx.method, route, status: ctx.status, ms: seconds * 1000, user_id: ctx.state.user?.id }, 'request');
  }
}
