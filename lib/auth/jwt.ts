import { SignJWT, jwtVerify, errors } from 'jose';
import { webcrypto } from 'node:crypto';
import { LruCache } from '../lru';

/**
 * Claims of our session tokens: user id, role, the token version that revokes older tokens, and when
 * the user signed in (OIDC's `auth_time`, seconds). The sign-in time is the caller's to give, never the
 * issue time: a token made from another one carries the original sign-in, which routes that need a
 * recent one (api/route.ts `recentSignIn`) compare with.
 */
export interface SessionClaims {
  sub: string;
  role: 'user' | 'admin';
  tv: number;
  auth_time: number;
}

const ISSUER = 'kms';
const AUDIENCE = 'kms-api';
/** Our session tokens say what they are, so no other JWT signed with the secret passes for one. */
const TYP = 'kms-session+jwt';
/** Clocks of several API processes may differ a little. */
const CLOCK_SKEW_SECONDS = 30;

/**
 * What this process keeps for its signing secret: the HMAC key, imported once (given raw bytes, jose
 * imports them again on every call), and the tokens it has verified with their times. A client sends
 * the same token with every request, and verifying its HMAC through WebCrypto cost ~0.18 ms each (8 % of
 * the API's CPU serving GET /keys/list). Only verified tokens enter; their times are checked again on
 * every use, and the token version and account are still looked up per request
 * (api/middleware/auth.ts). Bounded, least recently used out. Another secret starts afresh.
 */
const VERIFIED_MAX = 10_000;
let kept: { secret: string; key: Promise<webcrypto.CryptoKey>; verified: LruCache<string, SessionClaims & { iat: number; exp: number }> } | undefined;
function keptFor(secret: string) {
  if (kept?.secret !== secret) {
    kept = {
      secret,
      key: webcrypto.subtle.importKey('raw', new TextEncoder().encode(secret), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign', 'verify']),
      verified: new LruCache({ max: VERIFIED_MAX }),
    };
  }
  return kept;
}

export async function signSession(claims: SessionClaims, secret: string, ttlSeconds: number, now: Date): Promise<{ token: string; expiresAt: Date }> {
  const iat = Math.floor(now.getTime() / 1000);
  const token = await new SignJWT({ role: claims.role, tv: claims.tv, auth_time: claims.auth_time })
    .setProtectedHeader({ alg: 'HS256', typ: TYP })
    .setSubject(claims.sub)
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setIssuedAt(iat)
    .setExpirationTime(iat + ttlSeconds)
    .sign(await keptFor(secret).key);
  return { token, expiresAt: new Date((iat + ttlSeconds) * 1000) };
}

/**
 * jose's time checks with our clock tolerance: not expired, not issued in the future, not too old; and
 * the sign-in no later than the token's issue.
 */
const timely = (t: { iat: number; exp: number; auth_time: number }, nowSeconds: number, maxTtlSeconds: number) =>
  t.exp > nowSeconds - CLOCK_SKEW_SECONDS &&
  t.iat <= nowSeconds + CLOCK_SKEW_SECONDS &&
  nowSeconds - t.iat - CLOCK_SKEW_SECONDS <= maxTtlSeconds + CLOCK_SKEW_SECONDS &&
  t.exp - t.iat <= maxTtlSeconds &&
  t.auth_time <= t.iat;

/**
 * Returns the claims, or null for any invalid, expired or foreign token: `exp`, `iat`, `sub` and
 * `auth_time` are required, `typ` must be ours, and a token issued in the future (beyond the clock
 * skew) or living longer than `maxTtlSeconds` is refused.
 */
export async function verifySession(token: string, secret: string, now: Date, maxTtlSeconds: number): Promise<SessionClaims | null> {
  const { key, verified } = keptFor(secret);
  const nowSeconds = now.getTime() / 1000;
  const known = verified.get(token);
  if (known) return timely(known, nowSeconds, maxTtlSeconds) ? { sub: known.sub, role: known.role, tv: known.tv, auth_time: known.auth_time } : null;
  try {
    const { payload } = await jwtVerify(token, await key, {
      issuer: ISSUER,
      audience: AUDIENCE,
      algorithms: ['HS256'],
      typ: TYP,
      requiredClaims: ['exp', 'iat', 'sub', 'auth_time'],
      clockTolerance: CLOCK_SKEW_SECONDS,
      maxTokenAge: maxTtlSeconds + CLOCK_SKEW_SECONDS,
      currentDate: now,
    });
    const { sub, role, tv, iat, exp, auth_time } = payload;
    if (typeof sub !== 'string' || (role !== 'user' && role !== 'admin') || typeof tv !== 'number' || typeof auth_time !== 'number') return null;
    if (!timely({ iat: iat!, exp: exp!, auth_time }, nowSeconds, maxTtlSeconds)) return null;
    verified.set(token, { sub, role, tv, auth_time, iat: iat!, exp: exp! });
    return { sub, role, tv, auth_time };
  } catch (err) {
    if (err instanceof errors.JOSEError) return null;
    throw err;
  }
}
