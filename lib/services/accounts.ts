import type { Container } from '../container';
import { conflict, forbidden, gone, badRequest, tooManyRequests, unauthorized, type AppError } from '../errors';
import { hashPassword, verifyPassword, dummyHash } from '../auth/passwords';
import { signSession } from '../auth/jwt';
import { blockedFor, penalize } from '../auth/limiters';
import { hashToken, newToken } from '../tokens';
import { issuePartnerKey } from './partner-keys';
import { recordAudit, type RequestMeta } from '../../db/audit';
import { notify } from './notify';
import { bumpTokenVersion, duplicateField, findUserByEmail, findUserById, findUserByLogin, insertUser, updateUser, type UserRow } from '../../db/users';
import { retirePartnerKeys } from '../../db/partner-keys';
import { insertPasswordReset, lockPasswordReset, usePasswordResets } from '../../db/password-resets';

/** Account life cycle: registration, login, password change and recovery, profile, deletion. */

export async function newSession(c: Container, user: UserRow) {
  const { token, expiresAt } = await signSession({ sub: user.id, role: user.role, tv: user.token_version }, c.config.jwt.secret, c.config.jwt.ttlSeconds, c.clock.now());
  return { token, token_type: 'Bearer' as const, expires_at: expiresAt.toISOString() };
}

function duplicate(err: unknown): AppError | unknown {
  const field = duplicateField(err);
  return field ? conflict(`${field}_taken`, `An account with this ${field} already exists.`) : err;
}

const audit = (meta: RequestMeta) => (db: Container['db'], entry: Omit<Parameters<typeof recordAudit>[1], 'ip' | 'request_id'>) =>
  recordAudit(db, { ...entry, ip: meta.ip, request_id: meta.requestId });

export async function register(c: Container, input: { username: string; email: string; password: string; company_name?: string | null }, meta: RequestMeta) {
  const password_hash = await hashPassword(input.password, c.config.argon2MemoryKib);
  const role = c.config.adminEmails.includes(input.email.toLowerCase()) ? 'admin' : 'user';
  try {
    return await c.db.transaction(async (trx) => {
      const user = await insertUser(trx, { username: input.username, email: input.email, company_name: input.company_name ?? null, password_hash, role });
      const key = await issuePartnerKey(trx, user.id, c.clock.now(), c.config.partnerKeyTtlDays);
      await audit(meta)(trx, { user_id: user.id, action: 'partner.register', status: 'success', target: user.id, details: { role, api_key_prefix: key.row.prefix } });
      return { user, key, session: await newSession(c, user) };
    });
  } catch (err) {
    throw duplicate(err);
  }
}

const accountKey = (identifier: string) => identifier.trim().toLowerCase();

export async function login(c: Container, input: { identifier: string; password: string }, meta: RequestMeta) {
  const { loginAccount, loginIp } = c.limiters;
  const acct = accountKey(input.identifier);
  const wait = Math.max(await blockedFor(loginIp, meta.ip), await blockedFor(loginAccount, acct));
  const user = await findUserByLogin(c.db, input.identifier);
  const log = audit(meta);
  if (wait > 0) {
    await log(c.db, { user_id: user?.id ?? null, action: 'auth.login', status: 'failure', details: { reason: 'locked' } });
    throw tooManyRequests('Too many failed logins; wait before trying again.', wait);
  }
  const ok = await verifyPassword(user?.password_hash ?? (await dummyHash(c.config.argon2MemoryKib)), input.password);
  if (!user || !ok) {
    await Promise.all([penalize(loginAccount, acct), penalize(loginIp, meta.ip)]);
    await log(c.db, { user_id: user?.id ?? null, action: 'auth.login', status: 'failure', details: { reason: user ? 'wrong_password' : 'unknown_account' } });
    throw unauthorized('invalid_credentials', 'The username/email or password is wrong.');
  }
  await loginAccount.delete(acct).catch(() => undefined);
  let current = user;
  if (user.role !== 'admin' && c.config.adminEmails.includes(user.email.toLowerCase())) {
    current = await c.db.transaction(async (trx) => {
      const promoted = await updateUser(trx, user.id, { role: 'admin' });
      await log(trx, { user_id: user.id, action: 'user.promote', status: 'success', target: user.id, details: { via: 'ADMIN_EMAILS' } });
      return promoted;
    });
  }
  await log(c.db, { user_id: user.id, action: 'auth.login', status: 'success' });
  return { user: current, session: await newSession(c, current) };
}

async function checkPassword(c: Container, user: UserRow, password: string, action: string, meta: RequestMeta) {
  if (await verifyPassword(user.password_hash, password)) return;
  await penalize(c.limiters.loginAccount, accountKey(user.username));
  await audit(meta)(c.db, { user_id: user.id, action, status: 'failure', details: { reason: 'wrong_password' } });
  throw forbidden('wrong_password', 'The current password is wrong.');
}

export async function changePassword(c: Container, userId: string, input: { current_password: string; new_password: string }, meta: RequestMeta) {
  const user = (await findUserById(c.db, userId))!;
  await checkPassword(c, user, input.current_password, 'profile.change_password', meta);
  const password_hash = await hashPassword(input.new_password, c.config.argon2MemoryKib);
  const updated = await c.db.transaction(async (trx) => {
    const row = await bumpTokenVersion(trx, user.id, { password_hash });
    await audit(meta)(trx, { user_id: user.id, action: 'profile.change_password', status: 'success' });
    return row;
  });
  await notify(c, updated.email, 'password-changed', { username: updated.username, at: c.clock.now().toISOString() }, meta.requestId);
  return newSession(c, updated);
}

/** Answers the same whether or not the account exists; only an existing account gets a token. */
export async function forgotPassword(c: Container, email: string, meta: RequestMeta): Promise<void> {
  const user = await findUserByEmail(c.db, email);
  if (!user) return;
  const token = newToken();
  const ttl = c.config.resetTokenTtlMinutes;
  await c.db.transaction(async (trx) => {
    await insertPasswordReset(trx, { user_id: user.id, token_hash: hashToken(token), expires_at: new Date(c.clock.now().getTime() + ttl * 60_000) });
    await audit(meta)(trx, { user_id: user.id, action: 'auth.forgot_password', status: 'success' });
  });
  await notify(c, user.email, 'password-reset', { username: user.username, token, ttl_minutes: String(ttl) }, meta.requestId);
}

export async function resetPassword(c: Container, input: { token: string; new_password: string }, meta: RequestMeta) {
  const password_hash = await hashPassword(input.new_password, c.config.argon2MemoryKib);
  const now = c.clock.now();
  const user = await c.db.transaction(async (trx) => {
    const reset = await lockPasswordReset(trx, hashToken(input.token));
    if (!reset) throw badRequest('invalid_reset_token', 'The reset token is not valid.');
    const failure = reset.used_at ? 'reset_token_used' : reset.expires_at <= now ? 'reset_token_expired' : null;
    if (failure) {
      await audit(meta)(c.db, { user_id: reset.user_id, action: 'auth.reset_password', status: 'failure', details: { reason: failure } });
      throw gone(failure, failure === 'reset_token_used' ? 'This reset token was already used.' : 'This reset token has expired; ask for a new one.');
    }
    await usePasswordResets(trx, reset.user_id, now);
    const row = await bumpTokenVersion(trx, reset.user_id, { password_hash });
    await audit(meta)(trx, { user_id: row.id, action: 'auth.reset_password', status: 'success' });
    return row;
  });
  // A successful reset proves control of the mailbox: lift any login lockout on the account.
  await Promise.all([c.limiters.loginAccount.delete(accountKey(user.username)), c.limiters.loginAccount.delete(accountKey(user.email))]).catch(() => undefined);
  return user;
}

export async function updateProfile(c: Container, userId: string, patch: { username?: string; email?: string; company_name?: string | null }, meta: RequestMeta) {
  try {
    return await c.db.transaction(async (trx) => {
      const row = await updateUser(trx, userId, patch);
      await audit(meta)(trx, { user_id: userId, action: 'profile.update', status: 'success', details: { fields: Object.keys(patch) } });
      return row;
    });
  } catch (err) {
    throw duplicate(err);
  }
}

export async function setRotationPolicy(c: Container, userId: string, days: number | null, meta: RequestMeta) {
  return c.db.transaction(async (trx) => {
    const row = await updateUser(trx, userId, { rotation_days: days });
    await audit(meta)(trx, { user_id: userId, action: 'profile.update_rotation_days', status: 'success', details: { rotation_days: days } });
    return row;
  });
}

/**
 * Deletion keeps the row (audit rows point at it) but scrubs what identifies the person, frees the
 * username and email, revokes the partner key and bumps the token version so every session ends.
 */
export async function deleteAccount(c: Container, userId: string, password: string, meta: RequestMeta): Promise<void> {
  const user = (await findUserById(c.db, userId))!;
  if (user.role === 'admin') {
    await audit(meta)(c.db, { user_id: user.id, action: 'account.delete', status: 'failure', details: { reason: 'admin_account' } });
    throw forbidden('admin_account_protected', 'Administrator accounts cannot be deleted through the API.');
  }
  await checkPassword(c, user, password, 'account.delete', meta);
  const now = c.clock.now();
  await c.db.transaction(async (trx) => {
    await retirePartnerKeys(trx, user.id, 'revoked', now);
    await bumpTokenVersion(trx, user.id);
    await updateUser(trx, user.id, { username: `deleted-${user.id}`, email: `deleted-${user.id}@deleted.invalid`, company_name: null, password_hash: '!', deleted_at: now });
    await audit(meta)(trx, { user_id: user.id, action: 'account.delete', status: 'success', target: user.id });
  });
}
