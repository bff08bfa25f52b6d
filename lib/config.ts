import { z } from 'zod';
import { DEFAULT_KDF } from './lineage';
import { billingModeOf, buildPlans } from './billing/plans';
import { DEFAULT_SPARE_BYTES } from './blob/local';

/**
 * Twelve-factor configuration: every setting is an environment variable with a default that works on
 * a developer machine (Postgres and Redis on localhost). Production refuses the development secrets.
 */
const DEV_MASTER_KEY = 'dev:' + Buffer.alloc(32, 'kms-development-master-key-000000').toString('base64');
const DEV_JWT_SECRET = 'development-jwt-secret-change-me-0000000000';

const intish = (def: number, min = 0, max = Number.MAX_SAFE_INTEGER) => z.coerce.number().int().min(min).max(max).default(def);
const list = z
  .string()
  .default('')
  .transform((s) =>
    s
      .split(',')
      .map((x) => x.trim())
      .filter(Boolean),
  );

const Env = z.object({
  /** Unset counts as production: the public development secrets need NODE_ENV=development or test. */
  NODE_ENV: z.enum(['development', 'production', 'test']).default('production'),
  PORT: intish(3000, 0, 65535),
  PUBLIC_URL: z.string().url().optional(),
  /** The web console's built script (`npm run build` writes dist/console); unset: dist/console of the project. */
  CONSOLE_DIR: z.string().optional(),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  DATABASE_URL: z.string().default('postgres://postgres@127.0.0.1:5432/kms'),
  /**
   * `transaction`: DATABASE_URL leads to a pooler in transaction mode (PgBouncer), where consecutive
   * transactions of one client may run on different server connections: no session state is used
   * (db/knex.ts). `session`: DATABASE_URL is Postgres, or a pooler in session mode.
   */
  DATABASE_POOL_MODE: z.enum(['session', 'transaction']).default('session'),
  /**
   * Postgres itself, not a transaction-mode pooler: for what needs one session for long, the audit
   * relay's LISTEN (a notification goes to the session that listens). Required with
   * DATABASE_POOL_MODE=transaction; unset otherwise: DATABASE_URL.
   */
  DATABASE_DIRECT_URL: z.string().optional(),
  /**
   * A streaming standby of DATABASE_URL's primary (one server, not a balancer over several: its replay
   * position is read once for the whole pool) that takes the heavy reads which tolerate a little lag
   * (lib/replica-reads.ts). Unset: every read goes to the primary.
   */
  DATABASE_REPLICA_URL: z.string().optional(),
  /** A read leaves the primary only while the replica's replay lags less than this. */
  DATABASE_REPLICA_MAX_LAG_SECONDS: intish(5, 1, 3600),
  REDIS_URL: z.string().default('redis://127.0.0.1:6379'),
  /** A Redis Cluster's seed nodes, `host:port,…`: set, the service runs on the cluster (REDIS_URL then gives only user, password and scheme). */
  REDIS_CLUSTER_NODES: list,
  /** Prefix of every Redis key; hash tags built from it keep what one script or queue touches in one Cluster slot. */
  REDIS_PREFIX: z
    .string()
    .regex(/^[A-Za-z0-9_-]+$/)
    .default('kms'),
  /** Current master key, `kid:base64(32 bytes)`; MASTER_KEYS_PREVIOUS (comma separated) still open old seals. */
  MASTER_KEY: z.string().optional(),
  MASTER_KEYS_PREVIOUS: list,
  /**
   * The root key in a PKCS#11 token instead (RFC 7512: `pkcs11:token=…;object=…?module-path=…&pin-source=file:…`);
   * MASTER_KEY, when also set, is then a previous root (moving to the token). MASTER_KEY_URI_PREVIOUS names the
   * token object the root moves away from.
   */
  MASTER_KEY_URI: z.string().startsWith('pkcs11:').optional(),
  MASTER_KEY_URI_PREVIOUS: z.string().startsWith('pkcs11:').optional(),
  /**
   * Each new lineage gets its own AES-256 key in MASTER_KEY_URI's token, under which its private keys are
   * sealed; the key is deleted when the lineage's last generation is destroyed (lib/root-of-trust/lineage-keys.ts).
   */
  LINEAGE_TOKEN_KEYS: z.enum(['true', 'false']).default('false'),
  /** How often a process reloads the keyring; a rotation's new key becomes current after twice this. */
  KEYRING_REFRESH_MS: intish(10_000, 100, 600_000),
  JWT_SECRET: z.string().min(32).optional(),
  JWT_TTL_SECONDS: intish(3600, 60, 86400),
  SMTP_URL: z.string().optional(),
  MAIL_FROM: z.string().default('KMS <no-reply@kms.localhost>'),
  MAIL_DIR: z.string().default('var/mail'),
  SUPPORT_EMAIL: z.string().email().default('support@kms.localhost'),
  BLOB_STORE_URL: z.string().default('var/blobs'),
  S3_ENDPOINT: z.string().optional(),
  S3_REGION: z.string().default('us-east-1'),
  AWS_ACCESS_KEY_ID: z.string().optional(),
  AWS_SECRET_ACCESS_KEY: z.string().optional(),
  WORKER_QUEUES: z.string().default('crypto=2,rotation=2,notify=4,billing=2,team-sync=2,maintenance=1'),
  /** A job whose worker stops renewing its lock for this long (a crash) is taken again by another worker. */
  WORKER_LOCK_MS: intish(10_000, 1000),
  WORKER_STALLED_CHECK_MS: intish(10_000, 500),
  /** SIGTERM lets active jobs finish for this long; then they are stopped and retried by another worker. */
  WORKER_SHUTDOWN_GRACE_SECONDS: intish(30, 0, 3600),
  ADMIN_EMAILS: list,
  /** Proxies in front of the API whose X-Forwarded-For entries are trusted (right-most first); 0 ignores the header. */
  TRUSTED_PROXY_COUNT: intish(0, 0, 10),
  STRIPE_SECRET_KEY: z.string().optional(),
  STRIPE_WEBHOOK_SECRET: z.string().optional(),
  /** Billing (lib/billing/plans.ts): provider API base (a local stand-in in tests), price per paid plan, limit overrides, grace, redirects. */
  STRIPE_API_URL: z.string().url().optional(),
  STRIPE_PRICE_PRO: z.string().min(1).optional(),
  STRIPE_PRICE_BUSINESS: z.string().min(1).optional(),
  BILLING_PLANS: z.string().optional(),
  BILLING_ENFORCE_LIMITS: z.enum(['true', 'false']).optional(),
  BILLING_GRACE_DAYS: intish(7, 0, 90),
  BILLING_SUCCESS_URL: z.string().url().optional(),
  BILLING_CANCEL_URL: z.string().url().optional(),
  BILLING_RETURN_URL: z.string().url().optional(),
  PARTNER_KEY_TTL_DAYS: intish(90, 1, 3650),
  /** Requests per managed API key (`kms_sk_…`) per minute, over every API process (429 with Retry-After past it). */
  API_KEY_RATE_LIMIT_PER_MINUTE: intish(600, 1, 1_000_000),
  RESET_TOKEN_TTL_MINUTES: intish(30, 5, 1440),
  /** Routes that add a way into the account need a session signed in this recently (403 `reauthentication_required`). */
  RECENT_SIGN_IN_MINUTES: intish(10, 1, 1440),
  /** A password reset undoes the grants made this many days before it, until the owner reviews them (lib/accounts/recovery-review.ts). */
  RECOVERY_REVIEW_DAYS: intish(7, 1, 90),
  LOGIN_MAX_FAILURES: intish(5, 1, 100),
  LOGIN_LOCK_SECONDS: intish(900, 1, 86400),
  LOGIN_IP_MAX_FAILURES: intish(50, 1, 10000),
  MAX_FILE_BYTES: intish(8 * 1024 ** 3, 1),
  MAX_FILES_PER_JOB: intish(20, 1, 1000),
  JSON_BODY_LIMIT: z.string().default('256kb'),
  /** Queries of one API process allowed to wait for a database connection; past it new requests get 503 `overloaded` at once (0: no limit). */
  DB_WAITING_LIMIT: intish(200, 0, 100_000),
  /**
   * Postgres ends a service session left idle inside a transaction this long (0: the server's setting). A
   * process that stops mid-transaction (frozen, or stopped in a debugger) would otherwise hold its row locks
   * for good, and the jobs BullMQ hands to other workers would wait on them. Our transactions await only
   * SQL, except a customer's creation at the payment provider (lib/billing/provider.ts: 3 tries of 15 s at
   * most), so a minute never ends a healthy one.
   */
  DB_IDLE_IN_TRANSACTION_SECONDS: intish(60, 0, 86400),
  /**
   * Keys and signatures a caller sends are read and checked on threads of their own, stopped at the
   * deadline (lib/pgp/untrusted.ts): threads per process, tasks waiting beyond them (more get 503
   * `overloaded`), and the deadline in milliseconds (the task is refused with 422).
   */
  UNTRUSTED_THREADS: intish(1, 1, 64),
  UNTRUSTED_QUEUE: intish(32, 0, 10_000),
  UNTRUSTED_DEADLINE_MS: intish(10_000, 100, 600_000),
  JOB_RETENTION_HOURS: intish(24, 1, 24 * 90),
  ARGON2_MEMORY_KIB: intish(19456, 1024),
  LINEAGE_KDF_MEMORY_KIB: intish(DEFAULT_KDF.memoryKib, 1024),
  /** Cap on a compressed message's plaintext per file (decompression bombs); defaults to MAX_FILE_BYTES. */
  MAX_DECOMPRESSED_BYTES: intish(0, 0),
  /** Cap on what one job may write in all (every output file together); defaults to 4 × MAX_FILE_BYTES. */
  MAX_JOB_OUTPUT_BYTES: intish(0, 0),
  /** Wall-clock limit of one job attempt; a job past it fails cleanly (its blobs and sealed data go). */
  JOB_TIMEOUT_SECONDS: intish(6 * 3600, 1),
  /** A file job whose bytes stop moving for this long fails (hostile input that stalls a parser). */
  JOB_IDLE_SECONDS: intish(60, 1),
  /**
   * How often the job reconciler looks for unfinished jobs whose queue entry is gone (jobs/reconcile-jobs.ts),
   * and how old a job must be before it looks at it (one being enqueued right now has no entry yet).
   */
  JOB_RECONCILE_INTERVAL_SECONDS: intish(60, 1, 86400),
  JOB_RECONCILE_GRACE_SECONDS: intish(120, 1, 86400),
  /** How often every audit chain that moved gets a signed checkpoint; the signing key's age before it is replaced. */
  AUDIT_CHECKPOINT_INTERVAL_SECONDS: intish(300, 1, 86400),
  AUDIT_SIGNING_KEY_DAYS: intish(90, 1, 3650),
  /** How often the scheduler looks for keys whose rotation (schedule or account policy) is due. */
  ROTATION_SWEEP_SECONDS: intish(60, 1, 86400),
  /**
   * An upload must bring at least UPLOAD_MIN_BYTES_PER_SECOND on average over every window of
   * UPLOAD_RATE_WINDOW_SECONDS in which the service is reading it, or it ends with 408 `upload_too_slow`.
   */
  UPLOAD_MIN_BYTES_PER_SECOND: intish(1024, 1),
  UPLOAD_RATE_WINDOW_SECONDS: intish(30, 1, 3600),
  /** Uploads one account may have arriving at once (jobs started before their files have all come); more get 429. */
  UPLOADS_PER_ACCOUNT: intish(8, 1),
  /**
   * How long the API records the end of a whole upload again while Postgres is out of reach before it
   * answers 503 (the end is then kept in the blob store and recorded later: lib/jobs/job-records.ts).
   */
  UPLOAD_END_RETRY_SECONDS: intish(30, 0, 600),
  /**
   * Jobs a worker keeps open beyond its crypto slots (WORKER_QUEUES' crypto=N): a job waiting for its
   * upload's next bytes gives its slot back and waits among these, so slow clients cannot starve the pool.
   */
  WORKER_UPLOAD_WAITERS: intish(16, 0),
  /** Decrypted outputs are plaintext: they are kept for less time than encrypted ones. */
  DECRYPT_RETENTION_HOURS: intish(1, 1, 24 * 90),
  /** Temporary upload files and incomplete multipart uploads older than this are swept. */
  BLOB_TMP_MAX_AGE_HOURS: intish(24, 1),
  /** A local store keeps up to this much of deleted job files for later writes to overwrite (0: delete them). */
  BLOB_SPARE_MB: intish(DEFAULT_SPARE_BYTES / 2 ** 20, 0, 1 << 20),
  /** Webhooks to loopback, private and link-local addresses (SSRF) are refused unless this is true. */
  WEBHOOK_ALLOW_PRIVATE_ADDRESSES: z.enum(['true', 'false']).default('false'),
  WEBHOOK_TIMEOUT_SECONDS: intish(15, 1, 60),
  /** Waits before each retry of a failed delivery (Standard Webhooks' schedule, then daily: ~3 days in all). */
  WEBHOOK_RETRY_SCHEDULE: z.string().default('5s,5m,30m,2h,5h,10h,10h,24h'),
  /** How long a rotated-out webhook secret still signs (both signatures are sent). */
  WEBHOOK_SECRET_GRACE_HOURS: intish(24, 0, 24 * 7),
  /** Delivery records (and their attempts) older than this are purged. */
  WEBHOOK_RETENTION_DAYS: intish(30, 1, 365),
  /** Views of public share links (`GET /keys/share/{token}`, `GET /api-keys/shared/{token}`) per client address per minute. */
  SHARE_VIEWS_PER_MINUTE: intish(60, 1, 100_000),
  /** Passkeys (WebAuthn): relying party id (a domain: the origins' host or a parent of it; default PUBLIC_URL's host, `localhost`), display name, allowed page origins (comma separated; default: PUBLIC_URL's origin). */
  WEBAUTHN_RP_ID: z
    .string()
    .trim()
    .toLowerCase()
    .regex(/^[a-z0-9.-]+$/, 'a domain name, no scheme or port')
    .optional(),
  WEBAUTHN_RP_NAME: z.string().trim().min(1).max(100).default('KMS'),
  WEBAUTHN_ORIGINS: list,
  /** How long a passkey challenge (registration or login) may be answered. */
  WEBAUTHN_CHALLENGE_TTL_SECONDS: intish(300, 10, 3600),
  /** Bearer token that `GET /metrics` (API and worker ports) requires; unset: /metrics answers 404. */
  METRICS_TOKEN: z.string().min(16).optional(),
  /** A worker process serves /healthz, /readyz and /metrics on this port; unset: none (0: any free port). */
  WORKER_HTTP_PORT: z.coerce.number().int().min(0).max(65535).optional(),
  /**
   * Bull Board at /admin/queues (admins only): off, read-only, or read-write (retry, remove, ...). Off by
   * default: axe finds serious and critical faults in its UI (docs/console.md); /admin is the queue view.
   */
  QUEUE_DASHBOARD: z.enum(['off', 'read-only', 'read-write']).default('off'),
  /** Key lifecycle: days before expiry at which owners are warned, each once per generation. */
  KEY_EXPIRY_WARNING_DAYS: z
    .string()
    .default('30,14,7,1')
    .transform((v, ctx) => {
      const days = v.split(',').map((d) => Number(d.trim()));
      if (!days.length || days.some((d) => !Number.isInteger(d) || d < 1 || d > 365))
        ctx.addIssue({ code: 'custom', message: 'comma-separated whole days 1-365' });
      return [...new Set(days)].sort((a, b) => b - a);
    }),
  /** A rotated generation is `safe_to_retire` once it has not decrypted for this many days. */
  KEY_RETIRE_SAFE_DAYS: intish(30, 1, 3650),
});

export type Config = ReturnType<typeof loadConfig>;

export function loadConfig(env: NodeJS.ProcessEnv = process.env) {
  const parsed = Env.safeParse(env);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`);
    throw new Error(`invalid configuration:\n  ${lines.join('\n  ')}`);
  }
  const e = parsed.data;
  const production = e.NODE_ENV === 'production';
  // Says why the development defaults were not used: NODE_ENV unset counts as production.
  const why = `NODE_ENV is ${env.NODE_ENV ? e.NODE_ENV : 'unset (counts as production)'}; the public development defaults apply only with NODE_ENV=development or test (npm start sets development)`;
  // With a token as the root, MASTER_KEY is only what it moves from: no development default then.
  const lineageTokenKeys = e.LINEAGE_TOKEN_KEYS === 'true';
  // Refused rather than polled for: the relay is how audit_logs.recorded events happen at all, and one way of
  // hearing commits (LISTEN) is simpler to trust than a second, polling one that only this mode would run.
  if (e.DATABASE_POOL_MODE === 'transaction' && !e.DATABASE_DIRECT_URL)
    throw new Error(
      "DATABASE_POOL_MODE=transaction needs DATABASE_DIRECT_URL: a URL of Postgres itself (not the pooler) for the audit relay's LISTEN, which a transaction-mode pooler never delivers",
    );
  if (lineageTokenKeys && !e.MASTER_KEY_URI)
    throw new Error('LINEAGE_TOKEN_KEYS=true needs MASTER_KEY_URI: the per-lineage keys are made in the PKCS#11 token that holds the root key');
  const masterKeys = {
    ...checkMasterKeys(
      e.MASTER_KEY ?? (production || e.MASTER_KEY_URI ? undefined : DEV_MASTER_KEY),
      e.MASTER_KEYS_PREVIOUS,
      production,
      why,
      e.MASTER_KEY_URI,
    ),
    uri: e.MASTER_KEY_URI,
    previousUri: e.MASTER_KEY_URI_PREVIOUS,
    refreshMs: e.KEYRING_REFRESH_MS,
    lineageTokenKeys,
  };
  const jwtSecret = e.JWT_SECRET ?? (production ? undefined : DEV_JWT_SECRET);
  if (!jwtSecret) throw new Error(`JWT_SECRET must be set (32+ random characters): ${why}`);
  if (production && jwtSecret === DEV_JWT_SECRET)
    throw new Error('JWT_SECRET is the public development secret, which is not allowed outside development and test');
  if (production && Math.min(e.ARGON2_MEMORY_KIB, e.LINEAGE_KDF_MEMORY_KIB) < 19456)
    throw new Error('ARGON2_MEMORY_KIB and LINEAGE_KDF_MEMORY_KIB below 19456 are not allowed in production');
  return {
    env: e.NODE_ENV,
    production,
    port: e.PORT,
    publicUrl: (e.PUBLIC_URL ?? `http://localhost:${e.PORT}`).replace(/\/$/, ''),
    logLevel: e.LOG_LEVEL,
    consoleDir: e.CONSOLE_DIR,
    databaseUrl: e.DATABASE_URL,
    databasePoolMode: e.DATABASE_POOL_MODE,
    databaseDirectUrl: e.DATABASE_DIRECT_URL ?? e.DATABASE_URL,
    databaseReplica: e.DATABASE_REPLICA_URL ? { url: e.DATABASE_REPLICA_URL, maxLagMs: e.DATABASE_REPLICA_MAX_LAG_SECONDS * 1000 } : undefined,
    dbIdleInTransactionMs: e.DB_IDLE_IN_TRANSACTION_SECONDS * 1000,
    redisUrl: e.REDIS_URL,
    redisClusterNodes: e.REDIS_CLUSTER_NODES.map(clusterNode),
    redisPrefix: e.REDIS_PREFIX,
    masterKeys,
    jwt: { secret: jwtSecret, ttlSeconds: e.JWT_TTL_SECONDS },
    /** Settings that hold their public development value (development and test only): start-up warns of them. */
    developmentSecrets: [
      ...(masterKeys.current && keyMaterial(masterKeys.current).equals(DEV_MASTER_KEY_MATERIAL) ? ['MASTER_KEY' as const] : []),
      ...(jwtSecret === DEV_JWT_SECRET ? ['JWT_SECRET' as const] : []),
    ],
    trustedProxyCount: e.TRUSTED_PROXY_COUNT,
    mail: { smtpUrl: e.SMTP_URL, from: e.MAIL_FROM, dir: e.MAIL_DIR, support: e.SUPPORT_EMAIL },
    blob: {
      url: e.BLOB_STORE_URL,
      spareBytes: e.BLOB_SPARE_MB * 1024 * 1024,
      s3: { endpoint: e.S3_ENDPOINT, region: e.S3_REGION, accessKeyId: e.AWS_ACCESS_KEY_ID, secretAccessKey: e.AWS_SECRET_ACCESS_KEY },
    },
    workerQueues: parseQueueList(e.WORKER_QUEUES),
    workerLocks: { lockMs: e.WORKER_LOCK_MS, stalledCheckMs: e.WORKER_STALLED_CHECK_MS, shutdownGraceMs: e.WORKER_SHUTDOWN_GRACE_SECONDS * 1000 },
    adminEmails: e.ADMIN_EMAILS.map((x) => x.toLowerCase()),
    stripe: { secretKey: e.STRIPE_SECRET_KEY, webhookSecret: e.STRIPE_WEBHOOK_SECRET },
    billing: billingConfig(e),
    partnerKeyTtlDays: e.PARTNER_KEY_TTL_DAYS,
    apiKeys: { rateLimitPerMinute: e.API_KEY_RATE_LIMIT_PER_MINUTE },
    resetTokenTtlMinutes: e.RESET_TOKEN_TTL_MINUTES,
    recentSignInSeconds: e.RECENT_SIGN_IN_MINUTES * 60,
    recoveryReviewDays: e.RECOVERY_REVIEW_DAYS,
    login: { maxFailures: e.LOGIN_MAX_FAILURES, lockSeconds: e.LOGIN_LOCK_SECONDS, ipMaxFailures: e.LOGIN_IP_MAX_FAILURES },
    limits: {
      maxFileBytes: e.MAX_FILE_BYTES,
      maxFilesPerJob: e.MAX_FILES_PER_JOB,
      jsonBody: e.JSON_BODY_LIMIT,
      dbWaiting: e.DB_WAITING_LIMIT,
      maxDecompressedBytes: Math.min(e.MAX_DECOMPRESSED_BYTES || e.MAX_FILE_BYTES, e.MAX_FILE_BYTES),
      maxJobOutputBytes: e.MAX_JOB_OUTPUT_BYTES || 4 * e.MAX_FILE_BYTES,
    },
    jobLimits: { timeoutMs: e.JOB_TIMEOUT_SECONDS * 1000, idleMs: e.JOB_IDLE_SECONDS * 1000 },
    untrusted: { threads: e.UNTRUSTED_THREADS, maxQueued: e.UNTRUSTED_QUEUE, deadlineMs: e.UNTRUSTED_DEADLINE_MS },
    rotationSweepMs: e.ROTATION_SWEEP_SECONDS * 1000,
    jobReconcile: { intervalMs: e.JOB_RECONCILE_INTERVAL_SECONDS * 1000, graceMs: e.JOB_RECONCILE_GRACE_SECONDS * 1000 },
    auditCheckpoints: { intervalMs: e.AUDIT_CHECKPOINT_INTERVAL_SECONDS * 1000, signingKeyMaxAgeMs: e.AUDIT_SIGNING_KEY_DAYS * 86400_000 },
    uploadRate: { minBytesPerSecond: e.UPLOAD_MIN_BYTES_PER_SECOND, windowSeconds: e.UPLOAD_RATE_WINDOW_SECONDS },
    uploadsPerAccount: e.UPLOADS_PER_ACCOUNT,
    uploadEndRetryMs: e.UPLOAD_END_RETRY_SECONDS * 1000,
    uploadWaiters: e.WORKER_UPLOAD_WAITERS,
    jobRetentionHours: e.JOB_RETENTION_HOURS,
    decryptRetentionHours: Math.min(e.DECRYPT_RETENTION_HOURS, e.JOB_RETENTION_HOURS),
    blobTmpMaxAgeHours: e.BLOB_TMP_MAX_AGE_HOURS,
    webhooks: {
      allowPrivate: e.WEBHOOK_ALLOW_PRIVATE_ADDRESSES === 'true',
      timeoutMs: e.WEBHOOK_TIMEOUT_SECONDS * 1000,
      retryDelaysMs: parseDurations('WEBHOOK_RETRY_SCHEDULE', e.WEBHOOK_RETRY_SCHEDULE),
      secretGraceMs: e.WEBHOOK_SECRET_GRACE_HOURS * 3600_000,
      retentionDays: e.WEBHOOK_RETENTION_DAYS,
    },
    shares: { viewsPerMinute: e.SHARE_VIEWS_PER_MINUTE },
    monitoring: { metricsToken: e.METRICS_TOKEN, workerHttpPort: e.WORKER_HTTP_PORT, queueDashboard: e.QUEUE_DASHBOARD },
    argon2MemoryKib: e.ARGON2_MEMORY_KIB,
    lineageKdfMemoryKib: e.LINEAGE_KDF_MEMORY_KIB,
    webauthn: webauthnConfig(e, production),
    keyLifecycle: { expiryWarningDays: e.KEY_EXPIRY_WARNING_DAYS, retireSafeDays: e.KEY_RETIRE_SAFE_DAYS },
  };
}

/**
 * The start-up error for a dependency that `name` (REDIS_URL, DATABASE_URL) points at and that failed: one
 * line naming the setting, where it points (without a password) and what failed.
 */
export function dependencyFailed(name: string, url: string, what: string, err: unknown): Error {
  let where: string;
  try {
    const u = new URL(url);
    u.password = '';
    where = u.toString();
  } catch {
    where = 'a value that is not a URL';
  }
  return new Error(`${name}: ${what} at ${where} failed: ${reasonOf(err)}`);
}

/** An error's message; a connection refused on every address of a name (AggregateError) has none of its own. */
function reasonOf(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  if (err.message) return err.message;
  if (err instanceof AggregateError) return [...new Set(err.errors.map(reasonOf))].join('; ');
  return (err as NodeJS.ErrnoException).code ?? err.name;
}

const keyId = (spec: string) => (spec.indexOf(':') > 0 ? spec.slice(0, spec.indexOf(':')) : 'k1');
/** The key material of a `kid:base64` spec (as the sealer reads it), so a renamed development key is still caught. */
const keyMaterial = (spec: string) => Buffer.from(spec.slice(spec.indexOf(':') + 1), 'base64');
const DEV_MASTER_KEY_MATERIAL = keyMaterial(DEV_MASTER_KEY);

/**
 * Fails closed: no master key outside development and test, never the public development key there
 * (current or previous), and no key id twice (a previous key with the current id would replace it).
 */
function checkMasterKeys(
  current: string | undefined,
  previous: string[],
  production: boolean,
  why: string,
  uri: string | undefined,
): { current: string | undefined; previous: string[] } {
  if (!current && !uri) throw new Error(`MASTER_KEY must be set (kid:base64 of 32 random bytes), or MASTER_KEY_URI to a key in a PKCS#11 token: ${why}`);
  const given = current ? [current, ...previous] : previous;
  if (production && given.some((spec) => keyMaterial(spec).equals(DEV_MASTER_KEY_MATERIAL))) {
    throw new Error('the public development master key is not allowed in MASTER_KEY or MASTER_KEYS_PREVIOUS outside development and test');
  }
  const ids = given.map(keyId);
  const repeated = ids.find((id, i) => ids.indexOf(id) !== i);
  if (repeated) throw new Error(`master key id "${repeated}" appears more than once in MASTER_KEY and MASTER_KEYS_PREVIOUS`);
  return { current, previous };
}

/** `crypto=2,notify` → [{queue:'crypto', concurrency:2}, {queue:'notify', concurrency:1}] */
function parseQueueList(spec: string): { queue: string; concurrency: number }[] {
  return spec
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map((item) => {
      const [queue = '', n] = item.split('=');
      const concurrency = n === undefined ? 1 : Number(n);
      if (!queue || !Number.isInteger(concurrency) || concurrency < 1) throw new Error(`WORKER_QUEUES: bad entry "${item}"`);
      return { queue, concurrency };
    });
}

/** `10.0.0.5:7000` or `[::1]:7000` → {host, port}: a seed node of REDIS_CLUSTER_NODES. */
function clusterNode(item: string): { host: string; port: number } {
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([^\s:/[\]]+)):(\d{1,5})$/.exec(item);
  const port = Number(m?.[3]);
  if (!m || port < 1 || port > 65535) throw new Error(`REDIS_CLUSTER_NODES: bad entry "${item}" (use host:port)`);
  return { host: m[1] ?? m[2], port };
}

const UNIT_MS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;

/** `5s,5m,2h` → [5000, 300000, 7200000] */
function parseDurations(name: string, spec: string): number[] {
  return spec
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map((item) => {
      const m = /^(\d+)(ms|s|m|h|d)$/.exec(item);
      if (!m) throw new Error(`${name}: bad duration "${item}" (use e.g. 500ms, 5s, 5m, 2h, 1d)`);
      return Number(m[1]) * UNIT_MS[m[2] as keyof typeof UNIT_MS];
    });
}

/**
 * Passkeys: origins are exact `scheme://host[:port]` strings (the browser reports the page's origin in
 * every response). Production refuses plain http except for localhost (a secure context for browsers),
 * and origins whose host is neither the RP id nor below it (the browser would refuse every ceremony).
 */
function webauthnConfig(e: z.infer<typeof Env>, production: boolean) {
  const publicUrl = e.PUBLIC_URL ?? `http://localhost:${e.PORT}`;
  const origins = (e.WEBAUTHN_ORIGINS.length ? e.WEBAUTHN_ORIGINS : [new URL(publicUrl).origin]).map((o) => {
    let url: URL;
    try {
      url = new URL(o);
    } catch {
      throw new Error(`WEBAUTHN_ORIGINS: "${o}" is not a URL`);
    }
    if (!['http:', 'https:'].includes(url.protocol) || url.origin !== o.replace(/\/$/, ''))
      throw new Error(`WEBAUTHN_ORIGINS: "${o}" must be an origin, scheme://host[:port], without a path`);
    return url;
  });
  const rpId = e.WEBAUTHN_RP_ID ?? new URL(publicUrl).hostname;
  if (production) {
    if (/^[\d.]+$|:/.test(rpId)) throw new Error(`WEBAUTHN_RP_ID "${rpId}" is an IP address; browsers accept only a domain name`);
    const http = origins.find((u) => u.protocol === 'http:' && u.hostname !== 'localhost');
    if (http) throw new Error(`WEBAUTHN_ORIGINS: ${http.origin} is plain http; only https origins (or http://localhost) are allowed in production`);
    const foreign = origins.find((u) => u.hostname !== rpId && !u.hostname.endsWith(`.${rpId}`));
    if (foreign) throw new Error(`WEBAUTHN_RP_ID "${rpId}" must be the host of every origin or a parent domain of it (${foreign.origin} is not)`);
  }
  return { rpId, rpName: e.WEBAUTHN_RP_NAME, origins: origins.map((u) => u.origin), challengeTtlSeconds: e.WEBAUTHN_CHALLENGE_TTL_SECONDS };
}

/**
 * Billing: the mode follows STRIPE_SECRET_KEY's prefix (none: disabled). A live key outside production
 * refuses to start (a developer's machine must never charge real cards), and an enabled mode needs the
 * webhook signing secret (plans change only through verified webhooks). Plan limits are enforced when
 * billing is enabled; with billing disabled nobody could pay to lift them, so they apply only with
 * BILLING_ENFORCE_LIMITS=true.
 */
function billingConfig(e: z.infer<typeof Env>) {
  const mode = billingModeOf(e.STRIPE_SECRET_KEY);
  if (mode === 'live' && (e.NODE_ENV === 'development' || e.NODE_ENV === 'test')) {
    throw new Error(`STRIPE_SECRET_KEY is a live key, which is not allowed with NODE_ENV=${e.NODE_ENV}: use a test key (sk_test_...)`);
  }
  if (mode !== 'disabled' && !e.STRIPE_WEBHOOK_SECRET)
    throw new Error('STRIPE_WEBHOOK_SECRET must be set when STRIPE_SECRET_KEY is (plans change through verified webhooks)');
  const api = e.STRIPE_API_URL ? new URL(e.STRIPE_API_URL) : undefined;
  if (api && mode === 'live' && api.protocol !== 'https:') throw new Error('STRIPE_API_URL must be https with a live key');
  const base = (e.PUBLIC_URL ?? `http://localhost:${e.PORT}`).replace(/\/$/, '');
  return {
    mode,
    plans: buildPlans({ pro: e.STRIPE_PRICE_PRO, business: e.STRIPE_PRICE_BUSINESS }, e.BILLING_PLANS),
    enforceLimits: e.BILLING_ENFORCE_LIMITS ? e.BILLING_ENFORCE_LIMITS === 'true' : mode !== 'disabled',
    graceMs: e.BILLING_GRACE_DAYS * 86_400_000,
    api: api
      ? { host: api.hostname, port: Number(api.port || (api.protocol === 'https:' ? 443 : 80)), protocol: api.protocol.replace(':', '') as 'http' | 'https' }
      : undefined,
    successUrl: e.BILLING_SUCCESS_URL ?? `${base}/team?checkout=success`,
    cancelUrl: e.BILLING_CANCEL_URL ?? `${base}/team?checkout=cancelled`,
    returnUrl: e.BILLING_RETURN_URL ?? `${base}/team`,
  };
}
