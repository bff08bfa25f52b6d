import { AppError, forbidden, unauthorized } from '../../lib/errors';
import { verifySession } from '../../lib/auth/jwt';
import { hashToken } from '../../lib/tokens';
import { PARTNER_KEY_PREFIX } from '../../lib/services/partner-keys';
import { findUserById, type UserRow } from '../../db/users';
import { findPartnerKeyByHash, touchPartnerKey } from '../../db/partner-keys';
import { recordAudit } from '../../db/audit';
import type { Access, AppContext } from '../route';

export interface AuthUser {
  id: string;
  username: string;
  email: string;
  role: 'user' | 'admin';
  /** How the caller proved who it is: a session token, or a partner API key. */
  via: 'jwt' | 'partner_key';
}

const toAuthUser = (u: UserRow, via: AuthUser['via']): AuthUser => ({ id: u.id, username: u.username, email: u.email, role: u.role, via });

function challenge(code: string, message: string): AppError {
  const err = unauthorized(code, message);
  err.extra.headers = { 'WWW-Authenticate': `Bearer realm="kms", error="invalid_token"` };
  return err;
}

/**
 * Bearer credentials: a JWT from login, or a partner API key (recognised by its prefix). Routes with
 * access 'session' manage the account's own credentials and need a JWT: a leaked API key must not be
 * able to change the password or delete the account.
 */
export async function authenticate(ctx: AppContext, access: Access): Promise<AuthUser> {
  const { db, clock, config } = ctx.container;
  const header = ctx.get('authorization');
  const match = /^Bearer\s+(\S+)$/i.exec(header);
  if (!match) throw challenge('missing_credentials', 'Send "Authorization: Bearer <token>" with a session token or an API key.');
  const credential = match[1]!;
  const now = clock.now();

  if (credential.startsWith(PARTNER_KEY_PREFIX)) {
    const key = await findPartnerKeyByHash(db, hashToken(credential));
    if (!key || key.status !== 'active') throw challenge('invalid_api_key', 'The API key is unknown or was rotated or revoked.');
    if (key.expires_at <= now) throw challenge('api_key_expired', 'The API key has expired; rotate it to get a new one.');
    const user = await findUserById(db, key.user_id);
    if (!user) throw challenge('invalid_api_key', 'The API key is unknown or was rotated or revoked.');
    if (access === 'session') {
      await recordAudit(db, { user_id: user.id, action: 'auth.denied', status: 'failure', target: ctx.path, ip: ctx.ip, request_id: ctx.state.requestId, details: { reason: 'session_required' } });
      throw forbidden('session_required', 'This endpoint needs a session token from /auth/login; API keys are not accepted here.');
    }
    await touchPartnerKey(db, key.id, now);
    return toAuthUser(user, 'partner_key');
  }

  const claims = await verifySession(credential, config.jwt.secret, now, config.jwt.ttlSeconds);
  if (!claims) throw challenge('invalid_token', 'The session token is invalid or has expired; log in again.');
  const user = await findUserById(db, claims.sub);
  if (!user || user.token_version !== claims.tv) {
    if (user) {
      await recordAudit(db, { user_id: user.id, action: 'auth.denied', status: 'failure', target: ctx.path, ip: ctx.ip, request_id: ctx.state.requestId, details: { reason: 'token_revoked' } });
    }
    throw challenge('token_revoked', 'The session token is no longer valid (password changed, reset or account deleted); log in again.');
  }
  return toAuthUser(user, 'jwt');
}
