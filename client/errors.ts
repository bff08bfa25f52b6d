import type { components } from './openapi.js';

/** The service's RFC 9457 problem details (application/problem+json), as its OpenAPI document types them. */
export type Problem = components['schemas']['Problem'];

/**
 * A refused request: the problem the service answered, with its stable `code` (e.g. `wrong_passphrase`,
 * `token_revoked`, `rate_limited`). Branch on `code`, not on `message`.
 */
export class ProblemError extends Error {
  override readonly name = 'ProblemError';
  readonly status: number;
  readonly code: string;
  readonly problem: Problem;
  /** Seconds the service asked us to wait (429, 503), when it said. */
  readonly retryAfter?: number;

  constructor(status: number, problem: Problem, retryAfter?: number) {
    super(`${problem.detail ?? problem.title ?? `HTTP ${status}`} (${problem.code})`);
    this.status = status;
    this.code = problem.code;
    this.problem = problem;
    this.retryAfter = retryAfter;
  }
}

/** A job that ended `failed`: its error code and message come from the job (e.g. `integrity_check_failed`). */
export class JobFailedError extends Error {
  override readonly name = 'JobFailedError';
  constructor(
    readonly jobId: string,
    readonly code: string,
    message: string,
  ) {
    super(`job ${jobId} failed: ${message} (${code})`);
  }
}

/**
 * Something the client itself refuses or could not do (the service never answered, an output file
 * exists): `code` is ours, in the same style as the service's.
 */
export class ClientError extends Error {
  override readonly name = 'ClientError';
  /** The file an `output_exists` is about. */
  readonly path?: string;
  constructor(
    readonly code: 'network_error' | 'output_exists' | 'timeout' | 'unexpected_answer' | 'not_replayable' | 'job_not_completed',
    message: string,
    options?: { cause?: unknown; path?: string },
  ) {
    super(message, options);
    this.path = options?.path;
  }
}

/** Turns any answer that is not problem+json (a proxy's HTML page) into a problem with a generic code. */
export function problemOf(status: number, body: unknown): Problem {
  if (body && typeof body === 'object' && typeof (body as { code?: unknown }).code === 'string') return body as Problem;
  const text = typeof body === 'string' ? body.slice(0, 200) : '';
  return { type: 'about:blank', title: `HTTP ${status}`, status, detail: text || `The service answered HTTP ${status}.`, code: `http_${status}` };
}

/** `Retry-After` as seconds (delta-seconds or an HTTP date), or undefined. */
export function retryAfterSeconds(value: string | null | undefined, now = Date.now()): number | undefined {
  if (!value) return undefined;
  if (/^\d+$/.test(value.trim())) return Number(value.trim());
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, Math.ceil((at - now) / 1000));
}
