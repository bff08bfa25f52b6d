import { randomUUID } from 'node:crypto';
import type { Next } from 'koa';
import type { AppContext } from '../route';

const SAFE_ID = /^[A-Za-z0-9._-]{1,128}$/;

/**
 * Request id (taken from X-Request-Id when sane, else new), a child logger carrying it, safe default
 * headers, and one access-log line per request. The line names the matched route template, not the raw
 * path, since some paths carry share tokens.
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
    const matched = (ctx as unknown as { _matchedRoute?: string })._matchedRoute;
    ctx.state.log.info(
      { method: ctx.method, route: matched ?? '(unmatched)', status: ctx.status, ms: Number(process.hrtime.bigint() - started) / 1e6, user_id: ctx.state.user?.id },
      'request',
    );
  }
}
