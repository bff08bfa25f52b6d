import type { Container } from '../container';
import { hashToken } from '../tokens';
import { recordAudit, type RequestMeta } from '../../db/audit';
import { auditRefusal } from './refusals';
import { findPartnerKeyByHash, type PartnerKeyRow } from '../../db/partner-keys';
import { findUserById, type UserRow } from '../../db/users';

/**
 * What the authentication middleware (api/middleware/auth.ts, admin.ts) asks of the database: whose a
 * partner key or a session is, and the audit row of a refusal. The middleware decides the order of the
 * checks, the limits spent before them and the errors; these answer only what it needs to decide.
 */

export type PartnerKeyCheck = { ok: true; key: PartnerKeyRow; user: UserRow } | { ok: false; code: 'invalid_api_key' | 'api_key_expired' };

/** The partner key a presented value is, and its live account: unknown, rotated, revoked or its account gone is `invalid_api_key`. */
export async function checkPartnerKey(c: Container, value: string, now: Date): Promise<PartnerKeyCheck> {
  const key = await findPartnerKeyByHash(c.db, hashToken(value));
  if (!key || key.status !== 'active') return { ok: false, code: 'invalid_api_key' };
  if (key.expires_at <= now) return { ok: false, code: 'api_key_expired' };
  const user = await findUserById(c.db, key.user_id);
  if (!user) return { ok: false, code: 'invalid_api_key' };
  return { ok: true, key, user };
}

/**
 * The live account of a verified session token, while the token's version is the account's (a password
 * change, reset or sign-out everywhere bumps it). `user` is also there when the version is stale, for
 * the refusal's audit row.
 */
export async function checkSessionUser(
  c: Container,
  userId: string,
  tokenVersion: number,
): Promise<{ ok: true; user: UserRow } | { ok: false; user?: UserRow }> {
  const user = await findUserById(c.db, userId);
  if (!user || user.token_version !== tokenVersion) return { ok: false, user };
  return { ok: true, user };
}

/** The audit row of a refused request (`sessions.deny`): the account if known, the route, and why. */
export const recordAuthDenied = (c: Container, userId: string | null, target: string, details: Record<string, unknown>, meta: RequestMeta) =>
  recordAudit(c.db, { user_id: userId, action: 'sessions.deny', status: 'failure', target, details }, meta);

/**
 * The audit row of a credential presented after it stopped being valid (a revoked session token; a
 * revoked, rotated-out or expired API key): counted per account like a locked login (lib/auth/refusals.ts),
 * since whoever kept a stolen one can repeat it at will.
 */
export const auditStaleCredential = (c: Container, userId: string, target: string, details: { reason: string; api_key_id?: string }, meta: RequestMeta) =>
  auditRefusal(c, 'stale-credential', { user_id: userId, action: 'sessions.deny', status: 'failure', target, details }, meta);
