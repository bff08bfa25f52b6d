import type { Next } from 'koa';
import { AppError, isDatabaseUnreachable, isRedisUnreachable, isSocketFailure, isStorageFull, notFound, storageFull, unavailable } from '../../lib/errors';
import type { AppContext } from '../context';
import { statusUrl } from '../../lib/jobs/job-records';
import { within } from '../../lib/within';
import { pingPostgres } from '../../lib/operations/health-checks';

const TITLES: Record<number, string> = {
  400: 'Bad Request',
  401: 'Unauthorized',
  402: 'Payment Required',
  403: 'Forbidden',
  404: 'Not Found',
  405: 'Method Not Allowed',
  408: 'Request Timeout',
  409: 'Conflict',
  410: 'Gone',
  413: 'Content Too Large',
  415: 'Unsupported Media Type',
  422: 'Unprocessable Content',
  429: 'Too Many Requests',
  431: 'Request Header Fields Too Large',
  500: 'Internal Server Error',
  501: 'Not Implemented',
  503: 'Service Unavailable',
  507: 'Insufficient Storage',
};

/** Errors thrown by libraries we use (body parsers, http-errors) carry a status but no code of ours. */
function fromForeign(err: { status?: number; statusCode?: number; type?: string; message?: string; expose?: boolean }): AppError | null {
  const status = err.status ?? err.statusCode;
  if (err.type === 'entity.too.large' || status === 413)
    return new AppError(413, 'payload_too_large', 'The request body is larger than this endpoint accepts.');
  if (err.type === 'entity.parse.failed' || err instanceof SyntaxError) return new AppError(422, 'malformed_body', 'The request body is not valid JSON.');
  if (err.type === 'encoding.unsupported' || status === 415)
    return new AppError(415, 'unsupported_media_type', 'This content type or encoding is not accepted.');
  if (status && status >= 400 && status < 500)
    return new AppError(status, 'bad_request', err.expose && err.message ? err.message : (TITLES[status] ?? 'Bad request'));
  return null;
}

/** Whether Postgres answers a trivial query within a second. */
const databaseAnswers = (ctx: AppContext): Promise<boolean> =>
  within(pingPostgres(ctx.container), 1000).then(
    () => true,
    () => false,
  );

/**
 * A dependency out of reach is 503 with Retry-After, never a 500: the same request may well succeed a
 * moment later. A bare socket error does not name its peer, so Postgres is asked whether it answers.
 */
async function dependencyFailure(ctx: AppContext, err: unknown): Promise<AppError | undefined> {
  const socket = isSocketFailure(err);
  if (isDatabaseUnreachable(err) || (socket && !(await databaseAnswers(ctx)))) {
    return unavailable('database_unavailable', 'The database is not reachable; try again shortly.');
  }
  if (isStorageFull(err)) return storageFull();
  if (isRedisUnreachable(err)) return unavailable('redis_unavailable', 'Redis is not reachable; try again shortly.');
  return socket ? unavailable('dependency_unavailable', 'A service this request needs is not reachable; try again shortly.') : undefined;
}

export const problemTitle = (status: number) => TITLES[status] ?? 'Error';

/** The problem+json document of an error (RFC 9457). */
export function problemDocument(err: AppError, requestId?: string): Record<string, unknown> {
  return {
    // Extension members first: the standard members cannot be overwritten by them.
    ...err.extra.fields,
    type: `urn:kms:problem:${err.code}`,
    title: problemTitle(err.status),
    status: err.status,
    detail: err.message,
    code: err.code,
    request_id: requestId,
    ...(err.extra.errors?.length ? { errors: err.extra.errors } : {}),
  };
}

function send(ctx: AppContext, err: AppError) {
  ctx.status = err.status;
  for (const [k, v] of Object.entries(err.extra.headers ?? {})) ctx.set(k, v);
  ctx.type = 'application/problem+json';
  const { jobId } = ctx.state;
  ctx.body = { ...problemDocument(err, ctx.state.requestId), ...(jobId ? { job_id: jobId, status_url: statusUrl(jobId) } : {}) };
}

/**
 * The one place errors become HTTP: AppErrors and known library errors as problem+json with their code;
 * anything else is logged with its stack and answered as a bare 500. Unknown routes and methods answer
 * problem+json too (the router sets 405 and Allow, without a body).
 */
export async function errorHandler(ctx: AppContext, next: Next) {
  try {
    await next();
    if (ctx.body !== undefined && ctx.body !== null) return;
    if (ctx.status === 404) throw notFound('route_not_found', `No route for ${ctx.method} ${ctx.path}.`);
    if (ctx.status === 405) throw new AppError(405, 'method_not_allowed', `${ctx.method} is not allowed here; see the Allow header.`);
    if (ctx.status === 501) throw new AppError(501, 'not_implemented', `${ctx.method} is not supported.`);
  } catch (caught) {
    const err = caught instanceof AppError ? caught : ((await dependencyFailure(ctx, caught)) ?? fromForeign(caught as object));
    if (err) {
      if (err.status >= 500) ctx.state.log.warn({ code: err.code }, err.message);
      send(ctx, err);
      return;
    }
    ctx.state.log.error({ err: caught }, 'unhandled error');
    send(ctx, new AppError(500, 'internal_error', 'Something went wrong on our side; the request id helps us find it.'));
  }
}
