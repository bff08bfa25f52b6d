import { pino, stdSerializers, type Logger } from 'pino';

export type { Logger };

/**
 * pino JSON logs. Request bodies are never logged; redaction is a second line of defence for anything
 * secret that ends up in a logged object by mistake, at any depth (pino's own `redact` only matches
 * fixed paths): fields named like secrets are censored, and so are values shaped like our secrets
 * (API keys, sealed values, JWTs, bearer credentials, passwords in URLs, secret URL parameters) inside
 * any string: messages, interpolated arguments, child bindings, error messages and stacks included.
 */
const SECRET_NAME = /pass(word|phrase)|secret|token|api[_-]?key|authorization|cookie|sealed|private|credential|jwt|(master|data)[_-]?key/i;
/** Names that look like secrets but only ever hold ids, counts or kinds. */
const SAFE_NAMES = new Set(['token_type', 'token_version']);
const CENSOR = '[redacted]';
const SECRET_VALUE: [RegExp, string][] = [
  [/\bkms_[a-z]{2}_[A-Za-z0-9_-]{16,}/g, CENSOR], // our API keys
  [/\bs1\.[A-Za-z0-9_-]{1,32}\.[A-Za-z0-9_-]{16,}/g, CENSOR], // master-key sealed values
  [/\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*/g, CENSOR], // JWTs
  [/\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]+/gi, CENSOR],
  // The password of a connection URL (postgres://user:pw@host, redis://:pw@host).
  [/(\b[a-z][a-z0-9+.-]*:\/\/[^\s:/@]*:)[^\s@/]+@/gi, `$1${CENSOR}@`],
  // Secret-named query or fragment parameters (…#token=…, ?api_key=…).
  [/([?#&;][a-z0-9_-]*(?:token|key|secret|password|passphrase|signature)[a-z0-9_-]*=)[^&#\s"'<>]+/gi, `$1${CENSOR}`],
];
/** Deeper than this, a value is replaced (never passed through unscrubbed). */
const MAX_DEPTH = 32;

function scrubText(text: string): string {
  return SECRET_VALUE.reduce((t, [re, by]) => t.replace(re, by), text);
}

/** A Postgres error (pg's DatabaseError, or one serialized): a SQLSTATE and a severity. */
function isDbError(value: object): value is { code: string; message?: string } {
  const v = value as { code?: unknown; severity?: unknown };
  return typeof v.code === 'string' && /^[0-9A-Z]{5}$/.test(v.code) && typeof v.severity === 'string';
}

/** Fields of a database error in which Postgres repeats bound or stored values. */
const DB_LEAKY_FIELDS = ['detail', 'where', 'parameters', 'bindings', 'internalQuery', 'sql'];

/**
 * Marks an error whose message db/knex.ts has already cleaned (it knows where the SQL ends and the
 * Postgres message starts), so the logger leaves its quoted identifiers alone.
 */
export const DB_MESSAGE_CLEANED = Symbol.for('kms.db-message-cleaned');

/**
 * Postgres repeats the offending input inside the message of a data exception (SQLSTATE class 22):
 * `invalid input syntax for type uuid: "<value>"`, `value "<value>" is out of range …`. Everything
 * between the first and the last double quote goes (a value may itself hold quotes).
 */
export function redactDataException(code: string | undefined, pgMessage: string): string {
  return code?.startsWith('22') ? pgMessage.replace(/"[\s\S]*"/, `"${CENSOR}"`) : pgMessage;
}

/** A copy of `value` with secret-named fields and secret-shaped strings censored, at any depth. */
function scrub(value: unknown, depth = 0, ancestors = new WeakSet<object>()): unknown {
  if (typeof value === 'string') return scrubText(value);
  if (!value || typeof value !== 'object') return value;
  if (depth > MAX_DEPTH) return '[too deep]';
  if (ancestors.has(value)) return '[circular]';
  if (Buffer.isBuffer(value) || ArrayBuffer.isView(value) || value instanceof ArrayBuffer) return `[${value.byteLength} bytes]`;
  ancestors.add(value);
  try {
    if (value instanceof Error) return scrub(errorFields(value), depth + 1, ancestors);
    if (Array.isArray(value)) return value.map((v) => scrub(v, depth + 1, ancestors));
    if (value instanceof Map) return scrub(Object.fromEntries([...value].map(([k, v]) => [String(k), v])), depth + 1, ancestors);
    if (value instanceof Set) return scrub([...value], depth + 1, ancestors);
    const toJSON = (value as { toJSON?: unknown }).toJSON;
    if (typeof toJSON === 'function') {
      let json: unknown;
      try {
        json = toJSON.call(value);
      } catch {
        return '[unserializable]';
      }
      if (json !== value) return scrub(json, depth + 1, ancestors);
    }
    const dbError = isDbError(value);
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) {
      if (dbError && DB_LEAKY_FIELDS.includes(k)) continue;
      out[k] = SECRET_NAME.test(k) && !SAFE_NAMES.has(k) && v !== null && v !== undefined ? CENSOR : scrub(v, depth + 1, ancestors);
    }
    return out;
  } finally {
    ancestors.delete(value);
  }
}

/**
 * What an error may tell the logs. Database errors keep their SQLSTATE, constraint and message but not
 * `detail`, `where` or `parameters`: Postgres puts the offending values there (`Key (token_hash)=(…)`),
 * and bound values (sealed secrets, hashes) must not reach the logs; nor the input value Postgres
 * repeats in the message of a data exception.
 */
function errorFields(err: Error): Record<string, unknown> {
  const fields = stdSerializers.err(err) as unknown as Record<string, unknown>;
  for (const leaky of DB_LEAKY_FIELDS) delete fields[leaky];
  // The message and stack include those of the causes: clean every database error of the chain.
  const chain = new Set<unknown>();
  for (let e: unknown = err; e instanceof Error && !chain.has(e); e = e.cause) {
    chain.add(e);
    if (!isDbError(e) || (e as unknown as Record<symbol, unknown>)[DB_MESSAGE_CLEANED]) continue;
    const clean = redactDataException(e.code, e.message ?? '');
    if (clean === e.message) continue;
    for (const f of ['message', 'stack'] as const) if (typeof fields[f] === 'string') fields[f] = fields[f].split(e.message).join(clean);
  }
  return fields;
}

export function createLogger(level: string, base: Record<string, unknown> = {}, destination?: pino.DestinationStream): Logger {
  const options: pino.LoggerOptions = {
    level,
    base: { pid: process.pid, ...base },
    serializers: { err: (err: Error) => scrub(err) as Record<string, unknown> },
    formatters: {
      log: (object) => scrub(object) as Record<string, unknown>,
      bindings: (bindings) => scrub(bindings) as Record<string, unknown>,
    },
    hooks: {
      // The message and its interpolated arguments are outside the logged object: scrub them too.
      logMethod(args, method) {
        const first = args[0];
        const rest = args.slice(1).map((a) => scrub(a));
        method.apply(this, [typeof first === 'string' ? scrubText(first) : first, ...rest] as Parameters<typeof method>);
      },
    },
    timestamp: pino.stdTimeFunctions.isoTime,
  };
  const logger = destination ? pino(options, destination) : pino(options);
  // pino applies `formatters.bindings` to the base bindings only, not to a child's: scrub those here.
  // Children inherit this method from the root (Object.create), so it covers grandchildren too.
  type ChildFn = (this: unknown, bindings: pino.Bindings, options?: pino.ChildLoggerOptions) => unknown;
  // eslint-disable-next-line @typescript-eslint/unbound-method -- only called through `.call(this, …)` below, `this` being the logger asked for a child
  const child = logger.child as unknown as ChildFn;
  const scrubbingChild: ChildFn = function (bindings, childOptions) {
    return child.call(this, scrub(bindings) as pino.Bindings, childOptions);
  };
  logger.child = scrubbingChild as unknown as Logger['child'];
  return logger;
}
