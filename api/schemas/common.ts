import { z } from 'zod';

/** Shared payload pieces: problem details, pagination, timestamps. */
export const Problem = z
  .object({
    type: z.string(),
    title: z.string(),
    status: z.number().int(),
    detail: z.string(),
    code: z.string(),
    request_id: z.string().optional(),
    errors: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
  })
  .meta({ id: 'Problem' });

export const Timestamp = z.iso.datetime({ offset: true });
/** Dates leave the service as ISO 8601 strings. */
export const iso = (d: Date) => d.toISOString();
export const isoOrNull = (d: Date | null | undefined) => (d ? d.toISOString() : null);

/**
 * A whole number from min to max, as a JSON number or as decimal digits (a path or query parameter, a form
 * field). Not z.coerce.number(), which reads Number(text): white space, '', '0x10', '1e3' and JSON's true
 * and null would pass as numbers. Documented as an integer.
 */
export const wholeNumber = (min: number, max: number) =>
  z.preprocess(
    (v) => (typeof v === 'string' && /^\d{1,16}$/.test(v) ? Number(v) : v),
    z
      .number({ error: 'must be a whole number (decimal digits)' })
      .int({ error: 'must be a whole number (decimal digits)' })
      .min(min, { error: `must be at least ${min}` })
      .max(max, { error: `must be at most ${max}` }),
  );

/**
 * A point in time from a query parameter: an ISO 8601 date (midnight UTC) or date-time with its offset. Not
 * z.coerce.date(), which reads new Date(text): '0' and '2020' passed as years, and a time without an offset
 * in the server's own time zone. Documented as a date-time.
 */
export const instant = z.preprocess(
  (v) => (typeof v === 'string' && /^\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:\d{2}))?$/i.test(v) ? new Date(v) : v),
  z.date({ error: 'must be an ISO 8601 date, or date-time with an offset (2026-11-26T10:00:00Z)' }),
);

export const PageQuery = z.object({
  page: wholeNumber(1, 100_000).default(1),
  page_size: wholeNumber(1, 100).default(20),
});

export function pageOf<T extends z.ZodType>(item: T) {
  return z.object({
    items: z.array(item),
    page: z.number().int(),
    page_size: z.number().int(),
    total: z.number().int(),
  });
}

/** One line of text that must not be blank; trimmed; no control characters. */
export const text = (max: number) =>
  z
    .string()
    .trim()
    .min(1)
    .max(max)
    .regex(/^[^\p{Cc}]*$/u, 'must not contain control characters');
/** Free text (messages): line breaks and tabs allowed, other control characters not. */
export const multilineText = (max: number) =>
  z
    .string()
    .trim()
    .min(1)
    .max(max)
    .regex(/^(?:[\t\n\r]|[^\p{Cc}])*$/u, 'must not contain control characters other than tab and line breaks');
export const Email = z.string().trim().toLowerCase().pipe(z.email().max(254));
/** New passwords: at least 12 characters (OWASP ASVS 2.1.1); existing shorter ones still log in. */
export const Password = z.string().min(12, 'must be at least 12 characters').max(256);
