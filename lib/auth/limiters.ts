import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import type { Redis } from '../redis';
import type { Config } from '../config';
import { tooManyRequests, unavailable } from '../errors';

/**
 * Counters in Redis, shared by every API process: failed logins per account and per IP (lockout),
 * request budgets for public endpoints that send mail or create records, and the tallies of refusals
 * audited once per episode (RefusalTallies).
 */
export interface Limiters {
  /** Passkey challenges issued (each a short-lived Redis record): per address for login, per account for registration. */
  passkeyChallenge: RateLimiterRedis;
  loginAccount: RateLimiterRedis;
  loginIp: RateLimiterRedis;
  publicIp: RateLimiterRedis;
  /** Wrong passphrases per key lineage: an online guessing budget for stolen API credentials. */
  passphrase: RateLimiterRedis;
  /** Requests per managed API key (by key id, so a rotated value shares its budget). */
  apiKey: RateLimiterRedis;
  /** Public share-link views per client address (a point is spent before the token is looked up). */
  shareView: RateLimiterRedis;
  /** Share notices mailed to recipients, per account: share creation must not become a spam relay. */
  shareNotice: RateLimiterRedis;
  /** Organization invitations mailed, per organization: invitations must not become a spam relay. */
  invitationMail: RateLimiterRedis;
  /** Server-side audit chain verifications, per account: each reads the account's whole trail. */
  auditVerify: RateLimiterRedis;
  /** Password-reset mails per account: a reset request names someone else's address, from any number of addresses. */
  resetMail: RateLimiterRedis;
  refusals: RefusalTallies;
}

/** Password-reset mails an account gets in an hour, however many addresses ask. */
export const RESET_MAILS_PER_HOUR = 5;

/** How often an account may have its audit chain verified by the service (the export verifies offline, unlimited). */
export const AUDIT_VERIFICATIONS_PER_HOUR = 60;

export function createLimiters(redis: Redis, config: Config): Limiters {
  const base = { storeClient: redis, keyPrefix: `${config.redisPrefix}:rl` };
  return {
    passkeyChallenge: new RateLimiterRedis({ ...base, keyPrefix: `${base.keyPrefix}:passkey-challenge`, points: 200, duration: 600 }),
    loginAccount: new RateLimiterRedis({
      ...base,
      keyPrefix: `${base.keyPrefix}:login-acct`,
      points: config.login.maxFailures,
      duration: config.login.lockSeconds,
      blockDuration: config.login.lockSeconds,
    }),
    loginIp: new RateLimiterRedis({
      ...base,
      keyPrefix: `${base.keyPrefix}:login-ip`,
      points: config.login.ipMaxFailures,
      duration: 3600,
      blockDuration: config.login.lockSeconds,
    }),
    publicIp: new RateLimiterRedis({ ...base, keyPrefix: `${base.keyPrefix}:public-ip`, points: 30, duration: 600 }),
    passphrase: new RateLimiterRedis({ ...base, keyPrefix: `${base.keyPrefix}:passphrase`, points: 10, duration: 900, blockDuration: 900 }),
    apiKey: new RateLimiterRedis({ ...base, keyPrefix: `${base.keyPrefix}:api-key`, points: config.apiKeys.rateLimitPerMinute, duration: 60 }),
    shareView: new RateLimiterRedis({ ...base, keyPrefix: `${base.keyPrefix}:share-view`, points: config.shares.viewsPerMinute, duration: 60 }),
    shareNotice: new RateLimiterRedis({ ...base, keyPrefix: `${base.keyPrefix}:share-notice`, points: 30, duration: 3600 }),
    invitationMail: new RateLimiterRedis({ ...base, keyPrefix: `${base.keyPrefix}:invitation-mail`, points: 30, duration: 3600 }),
    auditVerify: new RateLimiterRedis({ ...base, keyPrefix: `${base.keyPrefix}:audit-verify`, points: AUDIT_VERIFICATIONS_PER_HOUR, duration: 3600 }),
    resetMail: new RateLimiterRedis({ ...base, keyPrefix: `${base.keyPrefix}:reset-mail`, points: RESET_MAILS_PER_HOUR, duration: 3600 }),
    refusals: new RefusalTallies(redis, `${base.keyPrefix}:refusals`),
  };
}

/** One episode of refusals on one audit chain: how many, since when, and the first one's audit row. */
interface RefusalTally {
  refused: number;
  first_refused_at: string;
  last_refused_at: string;
  action: string;
  reason: string;
}

/** How long a tally no event ended is kept after its last refusal. */
const TALLY_TTL_SECONDS = 30 * 86400;

/**
 * Refusals that anyone can repeat at will against an account (a locked login, a reset mail over its
 * budget, a credential presented after it stopped being valid) are counted, not audited one by one (lib/auth/refusals.ts writes the rows): the count of an
 * episode lives here, one hash per kind and audit chain, until the episode is ended. Not a secret.
 */
class RefusalTallies {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {}

  private key = (kind: string, chain: string) => `${this.prefix}:${kind}:${chain}`;

  /** Counts one refusal; answers its place in the episode (1: it opened the episode). */
  async note(kind: string, chain: string, first: { action: string; reason: string }, at: Date): Promise<number> {
    const key = this.key(kind, chain);
    const now = at.toISOString();
    const replies = await this.redis
      .multi()
      .hincrby(key, 'refused', 1)
      .hsetnx(key, 'first_refused_at', now)
      .hsetnx(key, 'action', first.action)
      .hsetnx(key, 'reason', first.reason)
      .hset(key, 'last_refused_at', now)
      .expire(key, TALLY_TTL_SECONDS)
      .exec();
    const [err, refused] = replies?.[0] ?? [new Error('the refusal tally was not counted')];
    if (err) throw err;
    return Number(refused);
  }

  /** Ends the episode: its tally, gone from Redis at once (a later refusal opens the next), or null when none is open. */
  async end(kind: string, chain: string): Promise<RefusalTally | null> {
    const key = this.key(kind, chain);
    const replies = await this.redis.multi().hgetall(key).del(key).exec();
    const [err, fields] = replies?.[0] ?? [new Error('the refusal tally was not read')];
    if (err) throw err;
    const t = fields as Record<string, string>;
    if (!t.refused) return null;
    return { refused: Number(t.refused), first_refused_at: t.first_refused_at, last_refused_at: t.last_refused_at, action: t.action, reason: t.reason };
  }
}

/** Spends one point; throws 429 with Retry-After once the budget is used up. */
export async function consume(limiter: RateLimiterRedis, key: string, message: string): Promise<void> {
  try {
    await limiter.consume(key);
  } catch (err) {
    if (err instanceof RateLimiterRes) throw tooManyRequests(message, err.msBeforeNext / 1000);
    // A command that timed out may still run once Redis answers again; the point is given back behind it
    // on the same connection, so a request refused 503 never counts against the budget.
    limiter.reward(key, 1).catch(() => undefined);
    throw unavailable('rate_limiter_unavailable', 'The rate limiter is not reachable; try again shortly.');
  }
}

/**
 * Guards an expensive check (argon2, a passphrase): one point is spent *before* the check runs, so no
 * number of parallel requests gets more checks than the budget; a check that passes gets its point back.
 * Throws 429 (with Retry-After) once the budget is spent, without running the check.
 */
export async function spendThenCheck<T>(
  budgets: { limiter: RateLimiterRedis; key: string }[],
  message: string,
  check: () => Promise<T>,
  passed: (result: T) => boolean,
): Promise<T> {
  const spent: typeof budgets = [];
  try {
    for (const b of budgets) {
      await consume(b.limiter, b.key, message);
      spent.push(b);
    }
  } catch (err) {
    // A budget that refused leaves the others as they were before this request.
    await Promise.all(spent.map((b) => b.limiter.reward(b.key, 1).catch(() => undefined)));
    throw err;
  }
  const result = await check();
  if (passed(result)) await Promise.all(budgets.map((b) => b.limiter.reward(b.key, 1).catch(() => undefined)));
  return result;
}
