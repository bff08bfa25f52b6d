import { SignJWT, jwtVerify, errors } from 'jose';

/** Claims of our session tokens: user id, role and the token version that revokes older tokens. */
export interface SessionClaims {
  sub: string;
  role: 'user' | 'admin';
  tv: number;
}

const ISSUER = 'kms';
const AUDIENCE = 'kms-api';

export async function signSession(claims: SessionClaims, secret: string, ttlSeconds: number, now: Date): Promise<{ token: string; expiresAt: Date }> {
  const iat = Math.floor(now.getTime() / 1000);
  const token = await new SignJWT({ role: claims.role, tv: claims.tv })
    .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
    .setSubject(claims.sub)
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setIssuedAt(iat)
    .setExpirationTime(iat + ttlSeconds)
    .sign(new TextEncoder().encode(secret));
  return { token, expiresAt: new Date((iat + ttlSeconds) * 1000) };
}

/** Returns the claims, or null for any invalid, expired or foreign token. */
export async function verifySession(token: string, secret: string, now: Date): Promise<SessionClaims | null> {
  try {
    const { payload } = await jwtVerify(token, new TextEncoder().encode(secret), {
      issuer: ISSUER,
      audience: AUDIENCE,
      algorithms: ['HS256'],
      currentDate: now,
    });
    const { sub, role, tv } = payload;
    if (typeof sub !== 'string' || (role !== 'user' && role !== 'admin') || typeof tv !== 'number') return null;
    return { sub, role, tv };
  } catch (err) {
    if (err instanceof errors.JOSEError) return null;
    throw err;
  }
}
