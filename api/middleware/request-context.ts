import { randomUUID } from 'node:crypto';
import type { Next } from 'koa';
import type { AppContext } from '../context';
import type { RequestMeta } from '../../db/audit';

/** The X-Request-Id a client may send: kept (as client_request_id) only in this form, dropped otherwise. */
const CLIENT_REQUEST_ID = /^[A-Za-z0-9._:-]{1,64}$/;

/** What audit rows (and jobs) record of a request: its client address, our id and the client's own. */
export const requestMeta = (ctx: AppContext): RequestMeta => ({ ip: ctx.ip, requestId: ctx.state.requestId, clientRequestId: ctx.state.clientRequestId });

/**
 * Request id (always the service's own: a client's X-Request-Id is kept beside it, when plain, as
 * client_request_id and echoed as X-Client-Request-Id, so that what a client sends never passes for
 * ours), a child logger carrying both,
 * safe default headers, one access-log line and the request metrics. Both name the matched route
 * template, not the raw path, since some paths carry share tokens (and templates keep the metrics'
 * label set bounded).
 */
export async function requestContext(ctx: AppContext, next: Next) {
  const started = process.hrtime.bigint();
  const incoming = ctx.get('x-request-id');
  const requestId = randomUUID();
  const clientRequestId = CLIENT_REQUEST_ID.test(incoming) ? incoming : undefined;
  ctx.state.requestId = requestId;
  ctx.state.clientRequestId = clientRequestId;
  ctx.state.log = ctx.container.log.child(clientRequestId ? { request_id: requestId, client_request_id: clientRequestId } : { request_id: requestId });
  ctx.set('X-Request-Id', requestId);
  // Echoed so a client can pair each answer with its request; in this form it is inert in any header.
  if (clientRequestId) ctx.set('X-Client-Request-Id', clientRequestId);
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
