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
    readonly extra: { errors?: FieldError[]; headers?: Record<string, string>; /** Extension members of the problem (RFC 9457 §3.2): machine-readable facts, never secrets. */ fields?: Record<string, unknown> } = {},
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
export const invalid = (code: string, message: string, errors: FieldError[] = []) =>
  new AppError(422, code, message, { errors });
export const tooManyRequests = (message: string, retryAfterSeconds: number) =>
  new AppError(429, 'rate_limited', message, { headers: { 'Retry-After': String(Math.max(1, Math.ceil(retryAfterSeconds))) } });
export const unavailable = (code: string, message: string) => new AppError(503, code, message);
