import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import type { Container } from '../container';
import { AppError, conflict, forbidden, gone, badRequest, invalid, unauthorized } from '../errors';
import { hashPassword, verifyPassword, dummyHash } from '../auth/passwords';
import { signSession } from '../auth/jwt';
import { consume, spendThenCheck } from '../auth/limiters';
import { SIGN_IN_ENDS, auditRefusal, endRefusals } from '../auth/refusals';
import { hashToken, newToken } from '../tokens';
import { issuePartnerKey } from './partner-keys';
import { revokeAllApiKeys } from './api-keys';
import { emitEvents } from '../events';
import { recordAudit, type RequestMeta } from '../../db/audit';
import { notify } from '../notify';
import { resetRequestAad } from '../../jobs/request-password-reset';
import { afterAccountDeleted, leaveOnDeletion } from '../teams/organizations';
import { reviewLines, undoRecentGrants } from './recovery-review';
import {
  insertContactRequest,
  bumpTokenVersion,
  duplicateField,
  findUserByEmail,
  findUserById,
  findUserByLogin,
  insertEmailChange,
  insertUser,
  lockEmailChange,
  lockLiveUser,
  updateUser,
  useEmailChanges,
  useEmailVerifications,
  type ContactRequest,
  type UserRow,
} from '../../db/users';
import { retirePartnerKeys } from '../../db/partner-keys';
import { deactivatePasskeys } from '../../db/passkeys';
import { insertPasswordReset, lockPasswordReset, usePasswordResets } from '../../db/password-resets';
import type { AuditAction } from '../event-names';

/** Account life cycle: registration, login, password change and recovery, profile, deletion. */

/** A session for a user who has just proved who they are: its sign-in time is now. */
export async function newSession(c: Container, user: UserRow) {
  const now = c.clock.now();
  const { token, expiresAt } = await signSession(
    { sub: user.id, role: user.role, tv: user.token_version, auth_time: Math.floor(now.getTime() / 1000) },
    c.config.jwt.secret,
    c.config.jwt.ttlSeconds,
    now,
  );
  return { token, token_type: 'Bearer' as const, expires_at: expiresAt.toISOString() };
}

/** A conflict (AppError) when `err` is a duplicate username or email; `err` itself otherwise. */
function duplicate(err: unknown): unknown {
  const field = duplicateField(err);
  return field ? conflict(`${field}_taken`, `An account with this ${field} already exists.`) : err;
}

const audit = (meta: RequestMeta) => (db: Container['db'], entry: Omit<Parameters<typeof recordAudit>[1], 'ip' | 'request_id'>) => recordAudit(db, entry, meta);

export async function register(c: Container, input: { username: string; email: string; password: string; company_name?: string | null }, meta: RequestMeta) {
  const password_hash = await hashPassword(input.password, c.config.argon2MemoryKib);
  try {
    const { verification, ...registered } = await c.db.transaction(async (trx) => {
      // Never admin: ADMIN_EMAILS applies to verified emails only (see verifiedEmail).
      const user = await insertUser(trx, {
        username: input.username,
        email: input.email,
        company_name: input.company_name ?? null,
        password_hash,
        role: 'user',
      });
      const key = await issuePartnerKey(trx, user.id, c.clock.now(), c.config.partnerKeyTtlDays);
      await audit(meta)(trx, {
        user_id: user.id,
        action: 'partners.register',
        status: 'success',
        target: user.id,
        details: { api_key_prefix: key.row.prefix },
      });
      const verification = await newEmailVerification(c, trx, user);
      return { user, key, session: await newSession(c, user), verification };
    });
    await mailEmailVerification(c, registered.user, verification, meta);
    return registered;
  } catch (err) {
    throw duplicate(err);
  }
}

/** How long the token confirming a new account's address lives. */
const EMAIL_VERIFY_TTL_HOURS = 48;

/**
 * A token that confirms the address the account has: an email change to the same address, redeemed by
 * confirmEmailChange (which then only marks the address verified).
 */
async function newEmailVerification(c: Container, trx: Knex, user: Pick<UserRow, 'id' | 'email'>): Promise<string> {
  const token = newToken();
  const expires_at = new Date(c.clock.now().getTime() + EMAIL_VERIFY_TTL_HOURS * 3600_000);
  await insertEmailChange(trx, { user_id: user.id, new_email: user.email, token_hash: hashToken(token), expires_at });
  return token;
}

const mailEmailVerification = (c: Container, user: Pick<UserRow, 'email' | 'username'>, token: string, meta: RequestMeta) =>
  notify(c, user.email, 'email-verify', { username: user.username, token, ttl_hours: String(EMAIL_VERIFY_TTL_HOURS) }, meta.requestId);

/**
 * Mails a new confirmation of the account's address. The account's budget is spent first, so a verified
 * account learns that it is (409) at the same pace as an unverified one gets mail.
 */
export async function resendEmailVerification(c: Container, userId: string, meta: RequestMeta): Promise<{ email: string }> {
  await consume(c.limiters.publicIp, `email-verify:${userId}`, 'Too many confirmation emails; wait before asking again.');
  const user = (await findUserById(c.db, userId))!;
  if (user.email_verified_at) throw conflict('email_already_verified', 'This email address is already confirmed.');
  const token = await newEmailVerification(c, c.db, user);
  await audit(meta)(c.db, { user_id: user.id, action: 'profiles.verify_email', status: 'success', details: { stage: 'confirmation_sent' } });
  await mailEmailVerification(c, user, token, meta);
  return { email: user.email };
}

/** The lockout is the account's (username and email share it); an unknown identifier counts on its own. */
const lockoutKey = (user: UserRow | undefined, identifier: string) => (user ? `user:${user.id}` : `unknown:${identifier.trim().toLowerCase()}`);

/**
 * The one password check (login, password change, account deletion): a point of the account's and
 * the address's failure budgets is spent *before* argon2 runs, so parallel guesses never get more tries
 * than the limit; a correct password gets them back and clears the account's lockout. Unknown accounts
 * cost the same argon2 time. Failures are audited under `action`; refusals by the lockout once per
 * episode (lib/auth/refusals.ts), which the next check that runs ends.
 */
async function checkAccountPassword(
  c: Container,
  user: UserRow | undefined,
  identifier: string,
  password: string,
  action: AuditAction,
  meta: RequestMeta,
): Promise<boolean> {
  const { loginAccount, loginIp } = c.limiters;
  const key = lockoutKey(user, identifier);
  const log = audit(meta);
  let ok: boolean;
  try {
    ok = await spendThenCheck(
      [
        { limiter: loginIp, key: meta.ip },
        { limiter: loginAccount, key },
      ],
      'Too many failed password attempts; wait before trying again.',
      async () => Boolean(await verifyPassword(user?.password_hash ?? (await dummyHash(c.config.argon2MemoryKib)), password)) && Boolean(user),
      (passed) => passed,
    );
  } catch (err) {
    if (err instanceof AppError && err.code === 'rate_limited')
      await auditRefusal(c, 'lockout', { user_id: user?.id ?? null, action, status: 'failure', details: { reason: 'locked' } }, meta);
    throw err;
  }
  await endRefusals(c, SIGN_IN_ENDS, user?.id ?? null, meta);
  if (ok) {
    await loginAccount.delete(key).catch(() => undefined);
    return true;
  }
  await log(c.db, { user_id: user?.id ?? null, action, status: 'failure', details: { reason: user ? 'wrong_password' : 'unknown_account' } });
  return false;
}

export async function login(c: Container, input: { identifier: string; password: string }, meta: RequestMeta) {
  const user = await findUserByLogin(c.db, input.identifier);
  if (!(await checkAccountPassword(c, user, input.identifier, input.password, 'sessions.login', meta)) || !user) {
    throw unauthorized('invalid_credentials', 'The username/email or password is wrong.');
  }
  await audit(meta)(c.db, { user_id: user.id, action: 'sessions.login', status: 'success' });
  return signIn(c, user, meta);
}

/** A session for a user who has just proved who they are (password or passkey), ADMIN_EMAILS applied. */
export async function signIn(c: Container, user: UserRow, meta: RequestMeta) {
  const current = user.email_verified_at ? await c.db.transaction((trx) => promoteAdminEmail(c, trx, user, meta)) : user;
  return { user: current, session: await newSession(c, current) };
}

/**
 * ADMIN_EMAILS makes an admin of an account only once its email is verified (the owner proved the
 * mailbox): never at registration or on an unconfirmed change, where anyone could claim the address.
 */
async function promoteAdminEmail(c: Container, trx: Knex.Transaction, user: UserRow, meta: RequestMeta): Promise<UserRow> {
  if (user.role === 'admin' || !user.email_verified_at || !c.config.adminEmails.includes(user.email.toLowerCase())) return user;
  const promoted = await updateUser(trx, user.id, { role: 'admin' });
  await audit(meta)(trx, { user_id: user.id, action: 'users.promote', status: 'success', target: user.id, details: { via: 'ADMIN_EMAILS' } });
  return promoted;
}

async function checkPassword(c: Container, user: UserRow, password: string, action: AuditAction, meta: RequestMeta) {
  if (await checkAccountPassword(c, user, user.username, password, action, meta)) return;
  throw forbidden('wrong_password', 'The current password is wrong.');
}

export async function changePassword(c: Container, userId: string, input: { current_password: string; new_password: string }, meta: RequestMeta) {
  const user = (await findUserById(c.db, userId))!;
  await checkPassword(c, user, input.current_password, 'passwords.change', meta);
  const password_hash = await hashPassword(input.new_password, c.config.argon2MemoryKib);
  const updated = await c.db.transaction(async (trx) => {
    const row = await bumpTokenVersion(trx, user.id, { password_hash });
    // Partner keys and pending email changes do not outlive the password: whoever held the account
    // may hold a key, or a confirmation token for an address of their own, too.
    const retired = await retirePartnerKeys(trx, user.id, 'revoked', c.clock.now());
    const voided = await useEmailChanges(trx, user.id, c.clock.now());
    await audit(meta)(trx, {
      user_id: user.id,
      action: 'passwords.change',
      status: 'success',
      details: { partner_keys_revoked: retired, email_changes_voided: voided },
    });
    return row;
  });
  await notify(c, updated.email, 'password-changed', { username: updated.username, at: c.clock.now().toISOString() }, meta.requestId);
  return newSession(c, updated);
}

/**
 * Does the same work whether or not an account has this address (seal, enqueue), so neither the answer
 * nor its timing tells them apart; the lookup runs in the `request-password-reset` job.
 */
export async function forgotPassword(c: Container, email: string, meta: RequestMeta): Promise<void> {
  const request_id = randomUUID();
  await c.jobs.enqueue('request-password-reset', { request_id, sealed_email: c.sealer.seal(email, resetRequestAad(request_id)) }, { meta });
}

/**
 * An existing account gets a reset token (stored as SHA-256) and the email carrying it, at most
 * RESET_MAILS_PER_HOUR an hour: anyone can ask for any address, so requests past it are refused (no
 * token, no mail) and audited once per episode (lib/auth/refusals.ts), which the next mail sent ends.
 */
export async function issuePasswordReset(c: Container, email: string, meta: RequestMeta): Promise<void> {
  const user = await findUserByEmail(c.db, email);
  if (!user) return;
  try {
    await consume(c.limiters.resetMail, user.id, 'Too many password-reset mails for this account.');
  } catch (err) {
    if (!(err instanceof AppError && err.code === 'rate_limited')) throw err;
    await auditRefusal(c, 'reset-mail', { user_id: user.id, action: 'passwords.request_reset', status: 'failure', details: { reason: 'rate_limited' } }, meta);
    return;
  }
  await endRefusals(c, 'reset-mail', user.id, meta);
  const token = newToken();
  const ttl = c.config.resetTokenTtlMinutes;
  await c.db.transaction(async (trx) => {
    await insertPasswordReset(trx, { user_id: user.id, token_hash: hashToken(token), expires_at: new Date(c.clock.now().getTime() + ttl * 60_000) });
    await audit(meta)(trx, { user_id: user.id, action: 'passwords.request_reset', status: 'success' });
  });
  await notify(c, user.email, 'password-reset', { username: user.username, token, ttl_minutes: String(ttl) }, meta.requestId);
}

/**
 * A reset is how an owner takes the account back from whoever else holds it, so it ends every credential
 * other than the new password: sessions (the token version moves on), partner keys, managed API keys and
 * their share links, and passkeys (deactivated: the owner makes active again the ones she recognises).
 * Access the account gave others in the last RECOVERY_REVIEW_DAYS is undone until the owner reviews it
 * (lib/accounts/recovery-review.ts). All in the reset's transaction; the confirmation email lists what
 * was ended and what awaits review.
 */
export async function resetPassword(c: Container, input: { token: string; new_password: string }, meta: RequestMeta) {
  const password_hash = await hashPassword(input.new_password, c.config.argon2MemoryKib);
  const now = c.clock.now();
  const { user, ended } = await c.db.transaction(async (trx) => {
    const reset = await lockPasswordReset(trx, hashToken(input.token));
    if (!reset) throw badRequest('invalid_reset_token', 'The reset token is not valid.');
    const failure = reset.used_at ? 'reset_token_used' : reset.expires_at <= now ? 'reset_token_expired' : null;
    if (failure) {
      await audit(meta)(c.db, { user_id: reset.user_id, action: 'passwords.reset', status: 'failure', details: { reason: failure } });
      throw gone(failure, failure === 'reset_token_used' ? 'This reset token was already used.' : 'This reset token has expired; ask for a new one.');
    }
    await usePasswordResets(trx, reset.user_id, now);
    const row = await bumpTokenVersion(trx, reset.user_id, { password_hash });
    // The reset proves the mailbox (reset tokens die when the email changes, so the token went to this
    // address): the email is verified. Partner keys and pending email changes do not outlive the old password.
    const verified = row.email_verified_at ? row : await updateUser(trx, row.id, { email_verified_at: now });
    const retired = await retirePartnerKeys(trx, row.id, 'revoked', now);
    const apiKeys = await revokeAllApiKeys(trx, row.id, now, 'password_reset', meta);
    const passkeys = await deactivatePasskeys(trx, row.id, now);
    for (const p of passkeys)
      await audit(meta)(trx, {
        user_id: row.id,
        action: 'passkeys.update',
        status: 'success',
        target: p.id,
        details: { active: false, reason: 'password_reset' },
      });
    const voided = await useEmailChanges(trx, row.id, now);
    const undone = await undoRecentGrants(c, trx, row.id, now, meta);
    const counts = {
      partner_keys_revoked: retired,
      api_keys_revoked: apiKeys.keys,
      api_key_shares_revoked: apiKeys.shares,
      passkeys_deactivated: passkeys.length,
    };
    await audit(meta)(trx, {
      user_id: row.id,
      action: 'passwords.reset',
      status: 'success',
      details: { ...counts, email_changes_voided: voided, grants_undone_for_review: undone.items.length },
    });
    return { user: await promoteAdminEmail(c, trx, verified, meta), ended: { counts, events: apiKeys.events, undone } };
  });
  // A successful reset proves control of the mailbox: lift any login lockout on the account.
  await c.limiters.loginAccount.delete(lockoutKey(user, user.username)).catch(() => undefined);
  await endRefusals(c, SIGN_IN_ENDS, user.id, meta);
  await emitEvents(c, user.id, ended.events);
  await ended.undone.after();
  const { partner_keys_revoked, api_keys_revoked, api_key_shares_revoked, passkeys_deactivated } = ended.counts;
  await notify(
    c,
    user.email,
    'password-reset-done',
    {
      username: user.username,
      at: now.toISOString(),
      partner_keys: String(partner_keys_revoked),
      api_keys: String(api_keys_revoked),
      api_key_shares: String(api_key_shares_revoked),
      passkeys: String(passkeys_deactivated),
      review: reviewLines(ended.undone.items),
      review_days: String(c.config.recoveryReviewDays),
    },
    meta.requestId,
  );
  return user;
}

/** Stored emails are trimmed and lower-cased (the Email schema): the same address in other case or spacing is no change. */
export const isEmailChange = (email: string | undefined, current: string): email is string =>
  email !== undefined && email.trim().toLowerCase() !== current.trim().toLowerCase();

/** How long an email-change confirmation token lives. */
const EMAIL_CHANGE_TTL_MINUTES = 60;

/**
 * A new email takes effect only once confirmed from that address, and asking for it needs the current
 * password (the same limited check as login): a stolen session alone cannot move the account's mail
 * (and with it, password resets) elsewhere. The old address is told once the change happens.
 */
export async function requestEmailChange(
  c: Container,
  userId: string,
  newEmail: string,
  currentPassword: string | undefined,
  meta: RequestMeta,
): Promise<void> {
  const user = (await findUserById(c.db, userId))!;
  // Re-sending the address the account has (a whole profile form sent back) changes nothing and needs no password.
  if (!isEmailChange(newEmail, user.email)) return;
  if (!currentPassword)
    throw invalid('validation_failed', 'Changing the email needs the current password.', [
      { path: 'body.current_password', message: 'required to change the email' },
    ]);
  await checkPassword(c, user, currentPassword, 'profiles.change_email', meta);
  const other = await findUserByEmail(c.db, newEmail);
  if (other) throw conflict('email_taken', 'An account with this email already exists.');
  // Each request mails an address of the caller's choosing: a budget per account keeps it from being a relay.
  await consume(c.limiters.publicIp, `email-change:${user.id}`, 'Too many email change requests; wait before asking again.');
  const token = newToken();
  await c.db.transaction(async (trx) => {
    await insertEmailChange(trx, {
      user_id: user.id,
      new_email: newEmail,
      token_hash: hashToken(token),
      expires_at: new Date(c.clock.now().getTime() + EMAIL_CHANGE_TTL_MINUTES * 60_000),
    });
    await audit(meta)(trx, { user_id: user.id, action: 'profiles.change_email', status: 'success', details: { stage: 'confirmation_sent' } });
  });
  await notify(c, newEmail, 'email-confirm', { username: user.username, token, ttl_minutes: String(EMAIL_CHANGE_TTL_MINUTES) }, meta.requestId);
}

/** Redeems an email-change token (single use): the new address is set, verified, and the old one told. */
export async function confirmEmailChange(c: Container, token: string, meta: RequestMeta): Promise<UserRow> {
  const now = c.clock.now();
  const { user, old } = await c.db
    .transaction(async (trx) => {
      const change = await lockEmailChange(trx, hashToken(token));
      if (!change) throw badRequest('invalid_email_token', 'The confirmation token is not valid.');
      const failure = change.used_at ? 'email_token_used' : change.expires_at <= now ? 'email_token_expired' : null;
      if (failure) {
        await audit(meta)(c.db, {
          user_id: change.user_id,
          action: 'profiles.change_email',
          status: 'failure',
          details: { stage: 'confirmation', reason: failure },
        });
        throw gone(failure, failure === 'email_token_used' ? 'This confirmation token was already used.' : 'This confirmation token has expired; ask again.');
      }
      const before = await lockLiveUser(trx, change.user_id);
      if (!before) throw badRequest('invalid_email_token', 'The confirmation token is not valid.');
      if (!isEmailChange(change.new_email, before.email)) {
        // The address the account has, confirmed (registration's mail): verified, nothing else changes.
        await useEmailVerifications(trx, before.id, change.new_email, now);
        const row = before.email_verified_at ? before : await updateUser(trx, before.id, { email_verified_at: now });
        await audit(meta)(trx, { user_id: row.id, action: 'profiles.verify_email', status: 'success', details: { stage: 'confirmed' } });
        return { user: await promoteAdminEmail(c, trx, row, meta), old: null };
      }
      await useEmailChanges(trx, before.id, now);
      // Reset tokens mailed to the old address die with it: only the new mailbox can recover the account.
      const resetsVoided = await usePasswordResets(trx, before.id, now);
      const row = await updateUser(trx, before.id, { email: change.new_email, email_verified_at: now });
      await audit(meta)(trx, {
        user_id: row.id,
        action: 'profiles.change_email',
        status: 'success',
        details: { stage: 'confirmed', reset_tokens_voided: resetsVoided },
      });
      return { user: await promoteAdminEmail(c, trx, row, meta), old: before };
    })
    .catch((err: unknown) => {
      throw duplicate(err);
    });
  if (old) await notify(c, old.email, 'email-changed', { username: user.username, new_email: user.email, at: now.toISOString() }, meta.requestId);
  return user;
}

export async function updateProfile(c: Container, userId: string, patch: { username?: string; company_name?: string | null }, meta: RequestMeta) {
  try {
    return await c.db.transaction(async (trx) => {
      const row = await updateUser(trx, userId, patch);
      await audit(meta)(trx, { user_id: userId, action: 'profiles.update', status: 'success', details: { fields: Object.keys(patch) } });
      return row;
    });
  } catch (err) {
    throw duplicate(err);
  }
}

/** Ends every session of the account (the token version moves on); API keys are not sessions and stay. */
export async function logout(c: Container, userId: string, meta: RequestMeta): Promise<void> {
  await c.db.transaction(async (trx) => {
    await bumpTokenVersion(trx, userId);
    await audit(meta)(trx, { user_id: userId, action: 'sessions.logout', status: 'success' });
  });
}

export async function setRotationPolicy(c: Container, userId: string, days: number | null, meta: RequestMeta) {
  return c.db.transaction(async (trx) => {
    const row = await updateUser(trx, userId, { rotation_days: days });
    await audit(meta)(trx, { user_id: userId, action: 'profiles.update_rotation_days', status: 'success', details: { rotation_interval_days: days } });
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
    await audit(meta)(c.db, { user_id: user.id, action: 'accounts.delete', status: 'failure', details: { reason: 'admin_account' } });
    throw forbidden('admin_account_protected', 'Administrator accounts cannot be deleted through the API.');
  }
  await checkPassword(c, user, password, 'accounts.delete', meta);
  const now = c.clock.now();
  const left = await c.db.transaction(async (trx) => {
    await retirePartnerKeys(trx, user.id, 'revoked', now);
    await bumpTokenVersion(trx, user.id);
    await updateUser(trx, user.id, {
      username: `deleted-${user.id}`,
      email: `deleted-${user.id}@deleted.invalid`,
      company_name: null,
      password_hash: '!',
      deleted_at: now,
    });
    await audit(meta)(trx, { user_id: user.id, action: 'accounts.delete', status: 'success', target: user.id });
    // Team access: the account leaves its organization; teammates linked to it lose its keys.
    return leaveOnDeletion(trx, user.id, now, meta);
  });
  await afterAccountDeleted(c, user.id, left, meta);
}

/** The signed-in account's row (its authentication found it live). */
export const currentUser = async (c: Container, userId: string): Promise<UserRow> => (await findUserById(c.db, userId))!;

/** A support or contact request, stored and audited together; answers its reference. */
export function submitContactRequest(c: Container, request: Omit<ContactRequest, 'user_id'>, userId: string | null, meta: RequestMeta): Promise<string> {
  return c.db.transaction(async (trx) => {
    const id = await insertContactRequest(trx, { ...request, user_id: userId });
    await recordAudit(trx, { user_id: userId, action: 'contact_requests.submit', status: 'success', target: id }, meta);
    return id;
  });
}
