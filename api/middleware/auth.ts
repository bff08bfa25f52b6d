import { AppError, forbidden, unauthorized } from '../../lib/errors';
import { verifySession } from '../../lib/auth/jwt';
import { PARTNER_KEY_PREFIX } from '../../lib/accounts/partner-keys';
import { MANAGED_KEY_PREFIX } from '../../lib/api-key-format';
import { consume } from '../../lib/auth/limiters';
import type { Scope } from '../../lib/auth/scopes';
import { recordApiKeyUse, verifyApiKey } from '../../lib/accounts/api-keys';
import { auditStaleCredential, checkPartnerKey, checkSessionUser, recordAuthDenied } from '../../lib/auth/authenticate';
import type { UserRow } from '../../db/users';
import type { Access, AppContext, AuthUser } from '../context';
import { requestMeta } from './request-context';
import { presentedCredential } from './browser-session';

const toAuthUser = (u: Pick<UserRow, 'id' | 'username' | 'email' | 'role'>, via: AuthUser['via']): AuthUser => ({
  id: u.id,
  username: u.username,
  email: u.email,
  role: u.role,
  via,
});

/** What audit rows name: the route template, never the raw path (a public share link's path is its token). */
const routeOf = (ctx: AppContext) => (ctx as unknown as { _matchedRoute?: string })._matchedRoute ?? ctx.path;

const API_KEY_REFUSALS = {
  invalid_api_key: 'The API key is unknown, mistyped or was revoked.',
  api_key_revoked: 'The API key was revoked; generate a new one.',
  api_key_expired: 'The API key has expired; generate a new one.',
  api_key_rotated: 'The API key was rotated and its grace period is over; use the new value.',
} as const;

const PARTNER_KEY_REFUSALS = {
  invalid_api_key: 'The API key is unknown or was rotated or revoked.',
  api_key_expired: 'The API key has expired; rotate it to get a new one.',
} as const;

/**
 * A managed key (`kms_sk_…`): checksum (no I/O), one indexed lookup, the per-key request budget (spent
 * before the request runs), one counter update. It never opens session or admin routes; route() checks
 * the scope of every other route.
 */
async function authenticateApiKey(ctx: AppContext, access: Access, credential: string): Promise<AuthUser> {
  const c = ctx.container;
  const now = c.clock.now();
  const check = await verifyApiKey(c, credential, now);
  if (!check.ok) {
    if (check.credential) {
      // A revoked, expired or rotated-out key is refused within the key's budget too, and counted, not audited per request.
      await consume(
        c.limiters.apiKey,
        check.credential.key_id,
        `This API key made more than ${c.config.apiKeys.rateLimitPerMinute} requests in a minute; slow down.`,
      );
      await auditStaleCredential(c, check.credential.user_id, routeOf(ctx), { reason: check.code, api_key_id: check.credential.key_id }, requestMeta(ctx));
    }
    throw challenge(check.code, API_KEY_REFUSALS[check.code]);
  }
  const key = check.credential;
  await consume(c.limiters.apiKey, key.key_id, `This API key made more than ${c.config.apiKeys.rateLimitPerMinute} requests in a minute; slow down.`);
  recordApiKeyUse(c, key.key_id, now);
  if (access === 'session' || access === 'admin') {
    await recordAuthDenied(c, key.user_id, routeOf(ctx), { reason: 'session_required', api_key_id: key.key_id }, requestMeta(ctx));
    throw forbidden('session_required', 'This endpoint needs a session token from /auth/login; managed API keys are not accepted here.');
  }
  return {
    ...toAuthUser({ id: key.user_id, username: key.username, email: key.email, role: key.role }, 'api_key'),
    apiKey: { id: key.key_id, scopes: key.scopes },
  };
}

function challenge(code: string, message: string): AppError {
  const err = unauthorized(code, message);
  err.extra.headers = { 'WWW-Authenticate': `Bearer realm="kms", error="invalid_token"` };
  return err;
}

/**
 * Bearer credentials: a JWT from login, the partner API key or a managed API key (each recognised by
 * its prefix); or the console's session cookie, which holds a JWT (api/middleware/browser-session.ts).
 * Routes with access 'session' manage the account's own credentials and need a JWT: a
 * leaked API key must not be able to change the password or delete the account.
 */
export async function authenticate(ctx: AppContext, access: Access): Promise<AuthUser> {
  const c = ctx.container;
  const { clock, config } = c;
  const presented = presentedCredential(ctx);
  if (!presented) throw challenge('missing_credentials', 'Send "Authorization: Bearer <token>" with a session token or an API key.');
  const credential = presented.token;
  const now = clock.now();

  // The console's cookie only ever holds a session token: API keys are Bearer credentials.
  if (presented.via === 'bearer' && credential.startsWith(MANAGED_KEY_PREFIX)) return authenticateApiKey(ctx, access, credential);

  if (presented.via === 'bearer' && credential.startsWith(PARTNER_KEY_PREFIX)) {
    const check = await checkPartnerKey(c, credential, now);
    if (!check.ok) throw challenge(check.code, PARTNER_KEY_REFUSALS[check.code]);
    const { key, user } = check;
    if (access === 'session') {
      await recordAuthDenied(c, user.id, routeOf(ctx), { reason: 'session_required' }, requestMeta(ctx));
      throw forbidden('session_required', 'This endpoint needs a session token from /auth/login; API keys are not accepted here.');
    }
    c.usage.record('partner_key', key.id, now);
    return toAuthUser(user, 'partner_key');
  }

  const claims = await verifySession(credential, config.jwt.secret, now, config.jwt.ttlSeconds);
  if (!claims) throw challenge('invalid_token', 'The session token is invalid or has expired; log in again.');
  const session = await checkSessionUser(c, claims.sub, claims.tv);
  if (!session.ok) {
    if (session.user) await auditStaleCredential(c, session.user.id, routeOf(ctx), { reason: 'token_revoked' }, requestMeta(ctx));
    throw challenge('token_revoked', 'The session token is no longer valid (password changed, reset or account deleted); log in again.');
  }
  return { ...toAuthUser(session.user, 'jwt'), signedInAt: new Date(claims.auth_time * 1000) };
}

/**
 * Sudo mode, checked once for every route declared with `recentSignIn` (by route()): a session signed in
 * longer than RECENT_SIGN_IN_MINUTES ago is refused (403 `reauthentication_required`, audited), so a
 * stolen session cannot add a way into the account that outlives it. API keys are not sessions and have
 * no sign-in to be old: a route taking them (webhooks) lets them through, and a password reset ends them.
 */
export async function requireRecentSignIn(ctx: AppContext): Promise<void> {
  const user = ctx.state.user;
  if (user && user.via !== 'jwt') return;
  const c = ctx.container;
  const maxAge = c.config.recentSignInSeconds;
  if (user?.signedInAt && c.clock.now().getTime() - user.signedInAt.getTime() <= maxAge * 1000) return;
  if (user) await recordAuthDenied(c, user.id, routeOf(ctx), { reason: 'reauthentication_required' }, requestMeta(ctx));
  const minutes = Math.round(maxAge / 60);
  const err = forbidden(
    'reauthentication_required',
    `This action needs a session signed in within the last ${minutes} minutes; sign in again (password or passkey) and retry with the new session.`,
  );
  // RFC 9470's step-up challenge: the sign-in is too old for this request.
  err.extra.headers = { 'WWW-Authenticate': `Bearer realm="kms", error="insufficient_user_authentication", max_age=${maxAge}` };
  err.extra.fields = { max_age_seconds: maxAge };
  throw err;
}

/**
 * The scope check of every route (called once, by route()): a managed API key needs the route's scope;
 * sessions and the partner key hold every scope. An 'auth' route without a scope (impossible through
 * route()'s types) refuses managed keys rather than letting them through.
 */
export async function requireScope(ctx: AppContext, scope: Scope | undefined): Promise<void> {
  const user = ctx.state.user;
  if (user?.via !== 'api_key') return;
  if (scope && user.apiKey?.scopes.includes(scope)) return;
  await recordAuthDenied(
    ctx.container,
    user.id,
    routeOf(ctx),
    { reason: 'insufficient_scope', scope: scope ?? null, api_key_id: user.apiKey?.id ?? null },
    requestMeta(ctx),
  );
  const err = forbidden(
    'insufficient_scope',
    scope ? `This API key lacks the scope "${scope}" that this endpoint needs.` : 'This endpoint does not accept managed API keys.',
  );
  // RFC 6750 §3.1: the scope the request needs, in the challenge.
  err.extra.headers = { 'WWW-Authenticate': `Bearer realm="kms", error="insufficient_scope"${scope ? `, scope="${scope}"` : ''}` };
  throw err;
}
