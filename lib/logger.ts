import { pino, stdSerializers, type Logger } from 'pino';

export type { Logger };

/**
 * pino JSON logs. Request bodies are never logged; redaction is a second line of defence for anything
 * secret that ends up in a logged object by mistake, at any depth (pino's own `redact` only matches
 * fixed paths): fields named like secrets are censored, and so are values shaped like our secrets
 * (API keys, sealed values, JWTs, bearer credentials) inside any string, error messages and stacks included.
 */
const SECRET_NAME = /pass(word|phrase)|secret|token|api[_-]?key|authorization|cookie|sealed|private|credential/i;
/** Names that look like secrets but only ever hold ids, counts or kinds. */
const SAFE_NAMES = new Set(['token_type', 'token_version']);
const SECRET_VALUE = [
  /\bkms_[a-z]{2}_[A-Za-z0-9_-]{16,}/g, // our API keys
  /\bs1\.[A-Za-z0-9_-]{1,32}\.[A-Za-z0-9_-]{16,}/g, // master-key sealed values
  /\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*/g, // JWTs
  /\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]+/gi,
];
const CENSOR = '[redacted]';
const MAX_DEPTH = 12;

function scrubText(text: string): string {
  return SECRET_VALUE.reduce((t, re) => t.replace(re, CENSOR), text);
}

/** A copy of `value` with secret-named fields and secret-shaped strings censored, at any depth. */
export function scrub(value: unknown, depth = 0, seen = new WeakSet<object>()): unknown {
  if (typeof value === 'string') return scrubText(value);
  if (!value || typeof value !== 'object' || depth > MAX_DEPTH) return value;
  if (seen.has(value)) return '[circular]';
  seen.add(value);
  if (Array.isArray(value)) return value.map((v) => scrub(v, depth + 1, seen));
  if (value instanceof Error) return scrub(errorFields(value), depth + 1, seen);
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    out[k] = SECRET_NAME.test(k) && !SAFE_NAMES.has(k) && v !== null && v !== undefined ? CENSOR : scrub(v, depth + 1, seen);
  }
  return out;
}

/**
 * What an error may tell the logs. Database errors keep their SQLSTATE, constraint and message but not
 * `detail`, `where` or `parameters`: Postgres puts the offending values there (`Key (token_hash)=(…)`),
 * and bound values (sealed secrets, hashes) must not reach the logs.
 */
function errorFields(err: Error): Record<string, unknown> {
  const fields = stdSerializers.err(err) as unknown as Record<string, unknown>;
  for (const leaky of ['detail', 'where', 'parameters', 'bindings', 'internalQuery', 'sql']) delete fields[leaky];
  return fields;
}

export function createLogger(level: string, base: Record<string, unknown> = {}, destination?: pino.DestinationStream): Logger {
  const options: pino.LoggerOptions = {
    level,
    base: { pid: process.pid, ...base },
    serializers: { err: (err: Error) => scrub(err) as Record<string, unknown> },
    formatters: { log: (object) => scrub(object) as Record<string, unknown> },
    hooks: {
      // Messages are strings outside the object: censor secret-shaped values there too.
      logMethod(args, method) {
        method.apply(this, args.map((a) => (typeof a === 'string' ? scrubText(a) : a)) as Parameters<typeof method>);
      },
    },
    timestamp: pino.stdTimeFunctions.isoTime,
  };
  return destination ? pino(options, destination) : pino(options);
}
