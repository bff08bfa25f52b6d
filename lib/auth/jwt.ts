import { SignJWT, jwtVerify, errors } from 'jose';
import { webcrypto } from 'node:crypto';

/** Claims of our session tokens: user id, role and the token version that revokes older tokens. */
export interface SessionClaims {
  sub: string;
  role: 'user' | 'admin';
  tv: number;
}

const ISSUER = 'kms';
const AUDIENCE = 'kms-api';
/** Our session tokens say what they are, so no other JWT signed with the secret passes for one. */
const TYP = 'kms-session+jwt';
/** Clocks of several API processes may differ a little. */
const CLOCK_SKEW_SECONDS = 30;

/** The HMAC key, imported once per secret: given raw bytes, jose imports them again on every call. */
let imported: { secret: string; key: Promise<webcrypto.CryptoKey> } | undefined;
function hmacKey(secret: string): Promise<webcrypto.CryptoKey> {
  if (imported?.secret !== secret) {
    imported = { secret, key: webcrypto.subtle.importKey('raw', new TextEncoder().encode(secret), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign', 'verify']) };
  }
  return imported.key;
}

export async function signSession(claims: SessionClaims, secret: string, ttlSeconds: number, now: Date): Promise<{ token: string; expiresAt: Date }> {
  const iat = Math.floor(now.getTime() / 1000);
  const token = await new SignJWT({ role: claims.role, tv: claims.tv })
    .setProtectedHeader({ alg: 'HS256', typ: TYP })
    .setSubject(claims.sub)
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setIssuedAt(iat)
    .setExpirationTime(iat + ttlSeconds)
    .sign(await hmacKey(secret));
  return { token, expiresAt: new Date((iat + ttlSeconds) * 1000) };
}

/**
 * Returns the claims, or null for any invalid, expired or foreign token: `exp`, `iat` and `sub` are
 * required, `typ` must be ours, and a token issued in the future (beyond the clock skew) or living
 * longer than `maxTtlSeconds` is refused.
 */
export async function verifySession(token: string, secret: string, now: Date, maxTtlSeconds: number): Promise<SessionClaims | null> {
  try {
    const { payload } = await jwtVerify(token, await hmacKey(secret), {
      issuer: ISSUER,
      audience: AUDIENCE,
      algorithms: ['HS256'],
      typ: TYP,
      requiredClaims: ['exp', 'iat', 'sub'],
      clockTolerance: CLOCK_SKEW_SECONDS,
      maxTokenAge: maxTtlSeconds + CLOCK_SKEW_SECONDS,
      currentDate: now,
    });
    const { sub, role, tv, iat, exp } = payload;
    if (typeof sub !== 'string' || (role !== 'user' && role !== 'admin') || typeof tv !== 'number') return null;
    const nowSeconds = now.getTime() / 1000;
    if (iat! > nowSeconds + CLOCK_SKEW_SECONDS || exp! - iat! > maxTtlSeconds) return null;
    return { sub, role, tv };
  } catch (err) {
    if (err instanceof errors.JOSEError) return null;
    throw err;
  }
}
