import { ClientError, JobFailedError, ProblemError } from '../client/index.js';

/** The documented exit codes (docs/cli.md). */
export const EXIT = { ok: 0, failed: 1, usage: 2, auth: 3, notFound: 4, limit: 5 } as const;

/** A wrong invocation found after parsing (a missing passphrase source, conflicting options). */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** Not logged in, or the stored session belongs to another service URL. */
export class AuthMissingError extends Error {
  override readonly name = 'AuthMissingError';
}

const LIMIT_CODES = /(_limit_reached|_limit|too_many_files|file_too_large|payload_too_large|rate_limited|quota)/;

/** The exit code for an error: 3 auth (401/403), 4 not found or gone (404/410), 5 limits (413/429/…), 1 the rest. */
export function exitCodeFor(err: unknown): number {
  if (err instanceof UsageError) return EXIT.usage;
  if (err instanceof AuthMissingError) return EXIT.auth;
  if (err instanceof JobFailedError) return EXIT.failed;
  if (err instanceof ProblemError) {
    if (err.status === 401 || err.status === 403) return EXIT.auth;
    if (err.status === 404 || err.status === 410) return EXIT.notFound;
    if (err.status === 413 || err.status === 429 || err.status === 402 || LIMIT_CODES.test(err.code)) return EXIT.limit;
    return EXIT.failed;
  }
  if (err instanceof ClientError) return EXIT.failed;
  return EXIT.failed;
}

/** The code printed with an error: the problem's or the job's code, ours otherwise. */
export function errorCode(err: unknown): string {
  if (err instanceof ProblemError || err instanceof JobFailedError || err instanceof ClientError) return err.code;
  if (err instanceof UsageError) return 'usage';
  if (err instanceof AuthMissingError) return 'not_logged_in';
  return 'error';
}
