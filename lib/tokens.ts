import { createHash, randomBytes } from 'node:crypto';

/** Random credentials: 32 bytes (256 bits) of entropy, base64url, behind a prefix that says what they are. */
export function newToken(prefix = ''): string {
  return prefix + randomBytes(32).toString('base64url');
}

/** Credentials are high-entropy, so a plain SHA-256 is a safe lookup hash (no salt or KDF needed). */
export function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}
