import type { z } from 'zod';

/**
 * What a request schema says about a field it refuses, in words a person reads in a form ("must not be
 * empty", "must be one of: a, b"), never the validator's own text ("Too small: expected string to have
 * >=1 characters", "Invalid input"). It is the error map of every request parse (api/route.ts); a message
 * a schema states itself (`.regex(re, 'must not contain control characters')`) takes precedence over it.
 */
type Issue = z.core.$ZodRawIssue;

const KINDS: Record<string, string> = {
  string: 'text',
  number: 'a number',
  int: 'a whole number',
  bigint: 'a whole number',
  boolean: 'true or false',
  object: 'an object',
  array: 'a list',
  date: 'a date',
  null: 'null',
  file: 'a file',
};

const FORMATS: Record<string, string> = {
  email: 'must be an email address',
  url: 'must be a URL',
  uuid: 'must be a UUID',
  guid: 'must be a UUID',
  datetime: 'must be a date-time with an offset (2026-11-26T10:00:00Z)',
  date: 'must be a date (2026-11-26)',
  time: 'must be a time of day (10:00:00)',
  duration: 'must be an ISO 8601 duration (P1D)',
  ipv4: 'must be an IPv4 address',
  ipv6: 'must be an IPv6 address',
  cidrv4: 'must be an IPv4 network (10.0.0.0/8)',
  cidrv6: 'must be an IPv6 network (fd00::/8)',
  base64: 'must be base64',
  base64url: 'must be base64url',
  hex: 'must be hexadecimal',
  jwt: 'must be a JWT',
  lowercase: 'must be in lower case',
  uppercase: 'must be in upper case',
  regex: 'is not in the accepted format',
};

const kind = (expected: string) => KINDS[expected] ?? expected;

/** A value as a person types it: strings bare, anything else as JSON. */
const shown = (value: unknown) => (typeof value === 'string' ? value : JSON.stringify(value));

const isCollection = (origin: string) => ['array', 'set', 'map', 'object'].includes(origin);

function tooSmall(origin: string, minimum: number | bigint | Date, inclusive: boolean | undefined): string {
  const at = inclusive === false ? 'more than' : 'at least';
  if (origin === 'string') return minimum === 1 ? 'must not be empty' : `must be at least ${String(minimum)} characters`;
  if (isCollection(origin)) return minimum === 1 ? 'must not be empty' : `must have at least ${String(minimum)} items`;
  if (origin === 'file') return `must be at least ${String(minimum)} bytes`;
  if (minimum instanceof Date) return `must not be before ${minimum.toISOString()}`;
  return `must be ${at} ${String(minimum)}`;
}

function tooBig(origin: string, maximum: number | bigint | Date, inclusive: boolean | undefined): string {
  const at = inclusive === false ? 'less than' : 'at most';
  if (origin === 'string') return `must be at most ${String(maximum)} characters`;
  if (isCollection(origin)) return `must have at most ${String(maximum)} items`;
  if (origin === 'file') return `must be at most ${String(maximum)} bytes`;
  if (maximum instanceof Date) return `must not be after ${maximum.toISOString()}`;
  return `must be ${at} ${String(maximum)}`;
}

/** A union refused: name the accepted kinds when every option refused the value's kind, else say so plainly. */
function noOption(issue: Extract<Issue, { code: 'invalid_union' }>): string {
  const { options } = issue as { options?: unknown[] };
  if (options?.length) return `must be one of: ${options.map(shown).join(', ')}`;
  const kinds = issue.errors.flatMap((branch) =>
    branch.length === 1 && branch[0].code === 'invalid_type' && !branch[0].path.length ? [branch[0].expected] : [],
  );
  if (kinds.length && kinds.length === issue.errors.length) return `must be ${[...new Set(kinds.map(kind))].join(' or ')}`;
  return 'does not match any accepted form';
}

/** The error map of request parsing: a message for every issue zod raises. */
export function fieldMessage(issue: Issue): string {
  switch (issue.code) {
    case 'invalid_type':
      if (issue.input === undefined) return 'is required';
      return `must be ${kind(issue.expected)}`;
    case 'too_small':
      return tooSmall(issue.origin, issue.minimum, issue.inclusive);
    case 'too_big':
      return tooBig(issue.origin, issue.maximum, issue.inclusive);
    case 'invalid_value':
      return issue.values.length === 1 ? `must be ${shown(issue.values[0])}` : `must be one of: ${issue.values.map(shown).join(', ')}`;
    case 'invalid_format': {
      const { prefix, suffix, includes } = issue as { prefix?: string; suffix?: string; includes?: string };
      if (issue.format === 'starts_with') return `must start with "${prefix}"`;
      if (issue.format === 'ends_with') return `must end with "${suffix}"`;
      if (issue.format === 'includes') return `must contain "${includes}"`;
      return FORMATS[issue.format] ?? `must be a valid ${issue.format}`;
    }
    case 'not_multiple_of':
      return `must be a multiple of ${String(issue.divisor)}`;
    case 'unrecognized_keys':
      return 'is not a field of this request';
    case 'invalid_union':
      return noOption(issue);
    case 'invalid_key':
      return 'has a key that is not accepted';
    case 'invalid_element':
      return 'has an item that is not accepted';
    default:
      return 'is not accepted';
  }
}
