import { createHash, randomBytes } from 'node:crypto';
import type {
  AuthenticationResponseJSON,
  PublicKeyCredentialCreationOptionsJSON,
  PublicKeyCredentialRequestOptionsJSON,
  RegistrationResponseJSON,
} from '@simplewebauthn/server';
import type { Container } from '../container';
import { AppError, badRequest, conflict, invalid, notFound, unauthorized } from '../errors';
import { consume, spendThenCheck } from '../auth/limiters';
import { SIGN_IN_ENDS, auditRefusal, endRefusals } from '../auth/refusals';
import { emitEvent } from '../events';
import { notify } from '../notify';
import { signIn, type newSession } from './user-accounts';
import { notYours } from '../auth/ownership';
import { auditedSuccess, recordAudit, type RequestMeta } from '../../db/audit';
import { findUserById, findUserByLogin, lockLiveUser, type UserRow } from '../../db/users';
import {
  pagePasskeys,
  advanceCounter,
  countPasskeys,
  credentialsOf,
  deletePasskey,
  findPasskey,
  findPasskeyByCredentialId,
  insertPasskey,
  updatePasskey,
  type PasskeyRow,
} from '../../db/passkeys';

/**
 * Passkeys (WebAuthn) with @simplewebauthn/server: registration by a signed-in user, and login that
 * answers the same session as password login. Challenges live in Redis under an opaque id, single use
 * (GETDEL), bound to their ceremony and (for registration) to the account; their expiry is decided by
 * `c.clock`. User verification is always required: a passkey replaces the password, so it must be two
 * factors on its own (the device and its PIN or biometric).
 */

/** Loaded at the first ceremony: ~12 MiB that an API process which never sees a passkey does not carry. */
const webauthn = () => import('@simplewebauthn/server');

/** EdDSA, ES256, RS256: what platform authenticators and security keys use. */
const ALGORITHMS = [-8, -7, -257];
const USER_VERIFICATION = 'required' as const;
/** Passkeys per account: a bound on a list the login options and excludeCredentials carry whole. */
const MAX_PASSKEYS = 20;

type Ceremony = 'register' | 'login';
interface ChallengeRecord {
  ceremony: Ceremony;
  challenge: string;
  /** Registration: the account; login: the account named in begin, or null (discoverable login). */
  user_id: string | null;
  expires_at: number;
}

const sha256 = (s: string) => createHash('sha256').update(s).digest('base64url');
/** Redis holds only a hash of the challenge id the client carries, as with every token we store. */
const challengeKey = (c: Container, id: string) => `${c.config.redisPrefix}:webauthn:challenge:${sha256(id)}`;

/** The WebAuthn user handle: the account id's 16 bytes (opaque, no personal data, stable). */
const userHandle = (userId: string) => Buffer.from(userId.replace(/-/g, ''), 'hex');

async function storeChallenge(c: Container, record: Omit<ChallengeRecord, 'expires_at'>): Promise<{ id: string; expiresAt: Date }> {
  const id = randomBytes(32).toString('base64url');
  const ttlMs = c.config.webauthn.challengeTtlSeconds * 1000;
  const expiresAt = new Date(c.clock.now().getTime() + ttlMs);
  // Redis keeps it a little longer than its life so an expired challenge is told apart from an unknown one.
  await c.redis.set(challengeKey(c, id), JSON.stringify({ ...record, expires_at: expiresAt.getTime() } satisfies ChallengeRecord), 'PX', ttlMs + 60_000);
  return { id, expiresAt };
}

/** Takes a challenge out of Redis (whatever happens next, it is spent) and checks its ceremony and age. */
async function takeChallenge(c: Container, id: string, ceremony: Ceremony): Promise<ChallengeRecord> {
  const raw = await c.redis.getdel(challengeKey(c, id));
  const record = raw ? (JSON.parse(raw) as ChallengeRecord) : null;
  if (!record || record.ceremony !== ceremony) {
    throw badRequest('challenge_not_found', 'This passkey challenge is unknown or was already used; begin again.');
  }
  if (c.clock.now().getTime() > record.expires_at) throw badRequest('challenge_expired', 'This passkey challenge has expired; begin again.');
  return record;
}

/**
 * A short, stable reason for a refused WebAuthn response, for audit rows and error bodies. The library's
 * own messages quote challenges and origins, so they are matched here and never passed on.
 */
type FailureReason =
  | 'wrong_origin'
  | 'wrong_rp_id'
  | 'wrong_challenge'
  | 'wrong_type'
  | 'user_verification_missing'
  | 'user_presence_missing'
  | 'unsupported_algorithm'
  | 'bad_signature'
  | 'malformed_response';

function reasonOf(err: unknown): FailureReason {
  const m = err instanceof Error ? err.message : '';
  if (/origin/i.test(m)) return 'wrong_origin';
  if (/RP ID/i.test(m)) return 'wrong_rp_id';
  if (/challenge/i.test(m)) return 'wrong_challenge';
  if (/response type/i.test(m)) return 'wrong_type';
  if (/user verification/i.test(m)) return 'user_verification_missing';
  if (/presen/i.test(m)) return 'user_presence_missing';
  if (/public key alg/i.test(m)) return 'unsupported_algorithm';
  return 'malformed_response';
}

const REASON_TEXT: Record<FailureReason, string> = {
  wrong_origin: 'the page origin is not one this service accepts',
  wrong_rp_id: 'the credential is for another relying party',
  wrong_challenge: 'the response answers another challenge',
  wrong_type: 'the response is of the wrong ceremony',
  user_verification_missing: 'the authenticator did not verify the user (PIN or biometric)',
  user_presence_missing: 'the authenticator did not report user presence',
  unsupported_algorithm: 'the credential uses an unsupported algorithm',
  bad_signature: 'the signature does not verify',
  malformed_response: 'the response is malformed',
};

const audit = (c: Container, meta: RequestMeta, entry: Omit<Parameters<typeof recordAudit>[1], 'ip' | 'request_id'>, db: Container['db'] = c.db) =>
  recordAudit(db, entry, meta);

// ---------------------------------------------------------------- registration

export async function beginRegistration(
  c: Container,
  user: { id: string; username: string },
): Promise<{ challengeId: string; expiresAt: Date; options: PublicKeyCredentialCreationOptionsJSON }> {
  await consume(c.limiters.passkeyChallenge, `register:${user.id}`, 'Too many passkey registrations were started; wait a few minutes.');
  const existing = await credentialsOf(c.db, user.id, false);
  const { rpId, rpName, challengeTtlSeconds } = c.config.webauthn;
  const { generateRegistrationOptions } = await webauthn();
  const options = await generateRegistrationOptions({
    rpName,
    rpID: rpId,
    userName: user.username,
    userID: userHandle(user.id),
    userDisplayName: user.username,
    timeout: challengeTtlSeconds * 1000,
    attestationType: 'none',
    // The authenticator refuses to make a second credential for the account on the same device.
    excludeCredentials: existing.map((p) => ({ id: p.credential_id, transports: p.transports })),
    authenticatorSelection: { residentKey: 'preferred', userVerification: USER_VERIFICATION },
    supportedAlgorithmIDs: ALGORITHMS,
  });
  const { id, expiresAt } = await storeChallenge(c, { ceremony: 'register', challenge: options.challenge, user_id: user.id });
  return { challengeId: id, expiresAt, options };
}

export async function completeRegistration(
  c: Container,
  userId: string,
  input: { challenge_id: string; credential: RegistrationResponseJSON; name?: string },
  meta: RequestMeta,
): Promise<PasskeyRow> {
  const fail = async (reason: string, err: AppError) => {
    await audit(c, meta, { user_id: userId, action: 'passkeys.add', status: 'failure', details: { reason } });
    return err;
  };
  const record = await takeChallenge(c, input.challenge_id, 'register');
  // Each account's challenge is its own: another account's (or a login challenge) never registers here.
  if (record.user_id !== userId)
    throw await fail('challenge_of_another_account', badRequest('challenge_not_found', 'This passkey challenge is unknown or was already used; begin again.'));

  const { rpId, origins } = c.config.webauthn;
  const { verifyRegistrationResponse } = await webauthn();
  let info;
  try {
    const result = await verifyRegistrationResponse({
      response: input.credential,
      expectedChallenge: record.challenge,
      expectedOrigin: origins,
      expectedRPID: rpId,
      requireUserVerification: true,
      supportedAlgorithmIDs: ALGORITHMS,
    });
    if (!result.verified) throw new Error('attestation does not verify');
    info = result.registrationInfo;
  } catch (err) {
    const reason = reasonOf(err);
    throw await fail(reason, invalid('passkey_verification_failed', `The passkey was not registered: ${REASON_TEXT[reason]}.`));
  }

  const name = input.name ?? `Passkey ${c.clock.now().toISOString().slice(0, 10)}`;
  let saved: { row: PasskeyRow; user: UserRow };
  try {
    saved = await c.db.transaction(async (trx) => {
      // The account row lock serialises registrations, so the limit holds under parallel requests.
      const user = await lockLiveUser(trx, userId);
      if (!user) throw unauthorized('token_revoked', 'The account no longer exists.');
      if ((await countPasskeys(trx, userId)) >= MAX_PASSKEYS)
        throw conflict('passkey_limit_reached', `An account has at most ${MAX_PASSKEYS} passkeys; delete one first.`);
      const row = await insertPasskey(trx, {
        user_id: userId,
        credential_id: info.credential.id,
        public_key: Buffer.from(info.credential.publicKey),
        counter: info.credential.counter,
        transports: info.credential.transports ?? [],
        device_type: info.credentialDeviceType,
        backed_up: info.credentialBackedUp,
        aaguid: info.aaguid,
        name,
      });
      await audit(
        c,
        meta,
        {
          user_id: userId,
          action: 'passkeys.add',
          status: 'success',
          target: row.id,
          details: { name, device_type: row.device_type, backed_up: row.backed_up, aaguid: row.aaguid },
        },
        trx,
      );
      return { row, user };
    });
  } catch (err) {
    // The credential id is unique across accounts: the same authenticator credential never signs two in.
    if ((err as { code?: string }).code === '23505') throw await fail('credential_exists', conflict('passkey_exists', 'This passkey is already registered.'));
    if (err instanceof AppError && err.code === 'passkey_limit_reached') throw await fail('limit_reached', err);
    throw err;
  }
  await emitEvent(c, userId, 'passkeys.added', { passkey_id: saved.row.id });
  await notify(c, saved.user.email, 'passkey-added', { username: saved.user.username, name, at: saved.row.created_at.toISOString() }, meta.requestId);
  return saved.row;
}

// ---------------------------------------------------------------- login

/**
 * Stand-in credential ids for a name with no passkeys (or no account): derived from the name under the
 * master key, so the answer has the same shape and stays the same on every request for that name.
 */
function decoyCredentials(c: Container, identifier: string) {
  const tag = c.sealer.mac(`webauthn-decoy:${identifier.trim().toLowerCase()}`);
  return [{ id: tag.slice(tag.lastIndexOf('.') + 1), transports: ['internal', 'hybrid'] }];
}

const NO_ACCOUNT = '00000000-0000-0000-0000-000000000000';

export async function beginLogin(
  c: Container,
  identifier: string | undefined,
  meta: RequestMeta,
): Promise<{ challengeId: string; expiresAt: Date; options: PublicKeyCredentialRequestOptionsJSON }> {
  await consume(c.limiters.passkeyChallenge, `login:${meta.ip}`, 'Too many passkey sign-ins were started from this address; wait a few minutes.');
  let userId: string | null = null;
  let allow: { id: string; transports?: string[] }[] = [];
  if (identifier) {
    const user = await findUserByLogin(c.db, identifier);
    // The same queries whether or not the account exists.
    const creds = await credentialsOf(c.db, user?.id ?? NO_ACCOUNT, true);
    userId = user?.id ?? null;
    allow = creds.length ? creds.map((p) => ({ id: p.credential_id, transports: p.transports })) : decoyCredentials(c, identifier);
  }
  const { rpId, challengeTtlSeconds } = c.config.webauthn;
  const { generateAuthenticationOptions } = await webauthn();
  const options = await generateAuthenticationOptions({
    rpID: rpId,
    allowCredentials: allow,
    timeout: challengeTtlSeconds * 1000,
    userVerification: USER_VERIFICATION,
  });
  const { id, expiresAt } = await storeChallenge(c, { ceremony: 'login', challenge: options.challenge, user_id: userId });
  return { challengeId: id, expiresAt, options };
}

type LoginCheck = { ok: true } | { ok: false; reason: string };

/**
 * Verifies an assertion and answers a session as password login does. A point of the address's and
 * (when the credential names one) the account's failure budgets is spent before the signature is
 * checked, and given back on success: parallel attempts never get more tries than the login limit.
 * Every failure is audited with its reason, refusals by the lockout once per episode (lib/auth/refusals.ts);
 * the caller learns only that the passkey was refused.
 */
export async function completeLogin(
  c: Container,
  input: { challenge_id: string; credential: AuthenticationResponseJSON },
  meta: RequestMeta,
): Promise<{ user: UserRow; session: Awaited<ReturnType<typeof newSession>>; passkey: PasskeyRow }> {
  const record = await takeChallenge(c, input.challenge_id, 'login');
  const passkey = await findPasskeyByCredentialId(c.db, input.credential.id);
  const user = passkey ? await findUserById(c.db, passkey.user_id) : undefined;
  const budgets = [{ limiter: c.limiters.loginIp, key: meta.ip }];
  if (user) budgets.push({ limiter: c.limiters.loginAccount, key: `user:${user.id}` });
  const auditFailure = (reason: string) =>
    audit(c, meta, {
      user_id: user?.id ?? null,
      action: 'sessions.login',
      status: 'failure',
      target: passkey?.id ?? null,
      details: { method: 'passkey', reason },
    });

  let outcome: LoginCheck;
  try {
    outcome = await spendThenCheck(
      budgets,
      'Too many failed sign-in attempts; wait before trying again.',
      () => checkAssertion(c, record, passkey, user, input.credential),
      (o) => o.ok,
    );
  } catch (err) {
    if (err instanceof AppError && err.code === 'rate_limited')
      await auditRefusal(
        c,
        'lockout',
        {
          user_id: user?.id ?? null,
          action: 'sessions.login',
          status: 'failure',
          target: passkey?.id ?? null,
          details: { method: 'passkey', reason: 'locked' },
        },
        meta,
      );
    throw err;
  }
  await endRefusals(c, SIGN_IN_ENDS, user?.id ?? null, meta);
  if (!outcome.ok) {
    await auditFailure(outcome.reason);
    if (outcome.reason === 'counter_not_increased') {
      await audit(c, meta, {
        user_id: user!.id,
        action: 'passkeys.suspect_clone',
        status: 'failure',
        target: passkey!.id,
        details: { stored_counter: passkey!.counter },
      });
    }
    throw unauthorized('passkey_login_failed', 'The passkey was not accepted.');
  }
  await audit(c, meta, { user_id: user!.id, action: 'sessions.login', status: 'success', target: passkey!.id, details: { method: 'passkey' } });
  return { ...(await signIn(c, user!, meta)), passkey: passkey! };
}

async function checkAssertion(
  c: Container,
  record: ChallengeRecord,
  passkey: PasskeyRow | undefined,
  user: UserRow | undefined,
  response: AuthenticationResponseJSON,
): Promise<LoginCheck> {
  if (!passkey) return { ok: false, reason: 'unknown_credential' };
  if (!user) return { ok: false, reason: 'account_deleted' };
  if (!passkey.active) return { ok: false, reason: 'passkey_inactive' };
  // Begin named an account: only its passkeys answer that challenge.
  if (record.user_id && record.user_id !== passkey.user_id) return { ok: false, reason: 'credential_of_another_account' };
  const handle = response.response.userHandle;
  if (handle && handle !== userHandle(user.id).toString('base64url')) return { ok: false, reason: 'user_handle_mismatch' };

  const { verifyAuthenticationResponse } = await webauthn();
  let info;
  try {
    const result = await verifyAuthenticationResponse({
      response,
      expectedChallenge: record.challenge,
      expectedOrigin: c.config.webauthn.origins,
      expectedRPID: c.config.webauthn.rpId,
      // Counter 0 here: the library would refuse a backwards counter with a message only; ours is below.
      credential: { id: passkey.credential_id, publicKey: new Uint8Array(passkey.public_key), counter: 0, transports: passkey.transports },
      requireUserVerification: true,
    });
    if (!result.verified) return { ok: false, reason: 'bad_signature' };
    info = result.authenticationInfo;
  } catch (err) {
    return { ok: false, reason: reasonOf(err) };
  }
  // The signature verified; now the counter. One that does not move forward (while either is non-zero)
  // means the same credential signs somewhere else too: a clone, or a replayed assertion.
  const { newCounter } = info;
  if ((newCounter > 0 || passkey.counter > 0) && newCounter <= passkey.counter) return { ok: false, reason: 'counter_not_increased' };
  if (!(await advanceCounter(c.db, passkey.id, newCounter, info.credentialBackedUp, c.clock.now()))) return { ok: false, reason: 'counter_not_increased' };
  return { ok: true };
}

// ---------------------------------------------------------------- management

/** The caller's passkey, or 404 (audited when it is another account's). */
async function ownPasskey(c: Container, userId: string, passkeyId: string, meta: RequestMeta): Promise<PasskeyRow> {
  const row = await findPasskey(c.db, passkeyId);
  if (row?.user_id === userId) return row;
  throw await notYours(c, { userId, resource: 'passkey', target: passkeyId, existsElsewhere: Boolean(row), meta });
}

export async function changePasskey(
  c: Container,
  userId: string,
  passkeyId: string,
  patch: { name?: string; active?: boolean },
  meta: RequestMeta,
): Promise<PasskeyRow> {
  await ownPasskey(c, userId, passkeyId, meta);
  return c.db.transaction(async (trx) => {
    const row = await updatePasskey(trx, userId, passkeyId, patch, c.clock.now());
    if (!row) throw notFound('passkey_not_found', 'No such passkey in your account.'); // deleted meanwhile
    await audit(c, meta, { user_id: userId, action: 'passkeys.update', status: 'success', target: passkeyId, details: { ...patch } }, trx);
    return row;
  });
}

/**
 * Deletes the passkey. Repeating it is harmless, as revoking a share or an API key is: a passkey of the
 * caller's already removed (its audit row is what is left of it) is done; one never theirs is a 404.
 */
export async function removePasskey(c: Container, userId: string, passkeyId: string, meta: RequestMeta): Promise<void> {
  if (!(await findPasskey(c.db, passkeyId)) && (await auditedSuccess(c.db, userId, 'passkeys.remove', passkeyId))) return;
  const row = await ownPasskey(c, userId, passkeyId, meta);
  const removed = await c.db.transaction(async (trx) => {
    if (!(await deletePasskey(trx, userId, passkeyId))) return false; // removed meanwhile, by a concurrent call
    await audit(c, meta, { user_id: userId, action: 'passkeys.remove', status: 'success', target: passkeyId, details: { name: row.name } }, trx);
    return true;
  });
  if (removed) await emitEvent(c, userId, 'passkeys.removed', { passkey_id: passkeyId });
}

/** A page of the account's passkeys, newest first. */
export const listPasskeys = (c: Container, userId: string, q: { page: number; pageSize: number }) => pagePasskeys(c.db, userId, q);
