/**
 * Errors are values with an HTTP status and a stable machine code. They are mapped to RFC 9457
 * problem+json in one place (api/middleware/errors.ts); anything else is an unexpected 500.
 */
export interface FieldError {
  path: string;
  message: string;
}

export class AppError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly extra: {
      errors?: FieldError[];
      headers?: Record<string, string>;
      /** Extension members of the problem (RFC 9457 §3.2): machine-readable facts, never secrets. */ fields?: Record<string, unknown>;
    } = {},
  ) {
    super(message);
    this.name = 'AppError';
  }
}

export const badRequest = (code: string, message: string) => new AppError(400, code, message);
export const unauthorized = (code: string, message: string) => new AppError(401, code, message);
/** 402: the account's plan does not allow this (billing); `fields` names the limit, its value and the usage. */
export const paymentRequired = (code: string, message: string, fields: Record<string, unknown>) => new AppError(402, code, message, { fields });
export const forbidden = (code: string, message: string) => new AppError(403, code, message);
export const notFound = (code: string, message: string) => new AppError(404, code, message);
export const conflict = (code: string, message: string) => new AppError(409, code, message);
export const gone = (code: string, message: string) => new AppError(410, code, message);
export const tooLarge = (code: string, message: string) => new AppError(413, code, message);
export const invalid = (code: string, message: string, errors: FieldError[] = []) => new AppError(422, code, message, { errors });
/** How a problem names the part of a request a field is in (the first segment of its path). */
const PARTS: Record<string, string> = { body: 'The request body is invalid', query: 'The query string is invalid', params: 'The path parameters are invalid' };

/**
 * 422 `validation_failed` for fields a request got wrong: `errors` lists each (path and what is wrong, in
 * words) and the detail names the first, so a client that shows only the detail still says which field
 * and why ("The request body is invalid: `name` must not be empty.").
 */
export function invalidFields(errors: FieldError[]): AppError {
  const [first] = errors;
  const [part = '', ...rest] = first.path.split('.');
  const field = rest.length ? `\`${rest.join('.')}\`` : 'it';
  const more = errors.length > 1 ? ` (${errors.length - 1} more in errors)` : '';
  return invalid('validation_failed', `${PARTS[part] ?? 'The request is invalid'}: ${field} ${first.message}.${more}`, errors);
}
/** The same Idempotency-Key with a different request (422, as Stripe): job submissions and API key generation alike. */
export const idempotencyKeyReused = () =>
  invalid('idempotency_key_reused', 'This Idempotency-Key was already used for a different request; use a new key for a new request.');
export const tooManyRequests = (message: string, retryAfterSeconds: number, code = 'rate_limited') =>
  new AppError(429, code, message, { headers: { 'Retry-After': String(Math.max(1, Math.ceil(retryAfterSeconds))) } });
/** 503: a dependency is down or out of reach; the client retries after a few seconds (Retry-After). */
export const unavailable = (code: string, message: string, retryAfterSeconds = 5) =>
  new AppError(503, code, message, { headers: { 'Retry-After': String(retryAfterSeconds) } });

/** SQLSTATE classes and codes that mean Postgres cannot be reached or is going away, not that the query was wrong. */
const PG_UNREACHABLE = /^(08...|57P0[123]|53300)$/;
// knex puts the statement before the driver's message (`select … - Connection terminated unexpectedly`).
const PG_UNREACHABLE_MESSAGES = /(^|- )(Connection terminated|Client has encountered a connection error|timeout exceeded when trying to connect)/;
const SOCKET_FAILURES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN']);

const codeOf = (err: Error) => (err as { code?: unknown }).code;

/** Postgres out of reach: a lost connection, no connection from the pool in time, a server shutting down. */
export const isDatabaseUnreachable = (err: unknown): boolean =>
  err instanceof Error && (err.name === 'KnexTimeoutError' || PG_UNREACHABLE.test(String(codeOf(err))) || PG_UNREACHABLE_MESSAGES.test(err.message));

/**
 * ioredis out of reach: a command unanswered within its timeout, a connection closed or not yet open,
 * or a Redis Cluster without a reachable server for the command's slot (during a failover).
 */
export const isRedisUnreachable = (err: unknown): boolean =>
  err instanceof Error &&
  (['MaxRetriesPerRequestError', 'ClusterAllFailedError'].includes(err.name) ||
    /^(Command timed out|Connection is closed|Stream isn't writeable|Cluster isn't ready|Too many Cluster redirections|CLUSTERDOWN)/.test(err.message));

/** The disk (or quota) under a local blob store is full. */
export const isStorageFull = (err: unknown): boolean => err instanceof Error && ['ENOSPC', 'EDQUOT'].includes(String(codeOf(err)));

/** 507: nothing more can be stored now; retrying at once will not help, so it is never retried by itself. */
export const storageFull = () =>
  new AppError(507, 'storage_full', 'The file store is full; nothing was kept. Try again later or with smaller files.', { headers: { 'Retry-After': '60' } });

/** A socket refused, reset or timed out: some dependency is out of reach (the error does not say which). */
export const isSocketFailure = (err: unknown): boolean =>
  err instanceof Error && typeof (err as { syscall?: unknown }).syscall === 'string' && SOCKET_FAILURES.has(String(codeOf(err)));

/**
 * A dependency (Postgres, Redis, the blob store's socket) out of reach, or our own 503 saying so: the
 * failure of the moment, not of the work, which may well succeed once the dependency answers again.
 */
export const isOutOfReach = (err: unknown): boolean =>
  (err instanceof AppError && err.status === 503) || isDatabaseUnreachable(err) || isRedisUnreachable(err) || isSocketFailure(err);
