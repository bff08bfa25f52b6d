import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { routes } from '../../api/app';
import { openApiDocument } from '../../api/route';
import { login, registerUser, startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { SoftAuthenticator } from '../support/webauthn';

/**
 * Sudo mode: routes that add or renew a way into the account (or move or delete it) need a session
 * signed in within RECENT_SIGN_IN_MINUTES; an older session gets 403 `reauthentication_required`, and
 * signing in again (password or passkey) gives a session that passes.
 */
const ORIGIN = 'http://localhost:4173';
const MINUTE = 60_000;

let s: TestService;
let clock: ManualClockFollowingTime;

beforeAll(async () => {
  s = await startTestService({ env: { WEBAUTHN_ORIGINS: ORIGIN } });
  clock = s.c.clock as ManualClockFollowingTime;
});
afterAll(async () => {
  await s?.stop();
});

type User = Awaited<ReturnType<typeof registerUser>>;

async function registerPasskey(token: string, auth = new SoftAuthenticator({ rpId: 'localhost' })) {
  const begun = await s.api('POST', '/auth/passkeys/register/begin', { token });
  expect(begun.status).toBe(200);
  const done = await s.api('POST', '/auth/passkeys/register/complete', {
    token,
    body: { challenge_id: begun.body.challenge_id, credential: auth.register(begun.body.options, { origin: ORIGIN }) },
  });
  expect(done.status).toBe(201);
  return { auth, passkeyId: done.body.passkey_id as string, challenge: begun.body };
}

/** What an account has that the sudo routes act on, made while its session is fresh. */
async function setUp(u: User) {
  const key = await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'ci', scopes: ['webhooks:write'] } });
  expect(key.status).toBe(201);
  const hook = await s.api('POST', '/webhooks', { token: u.token, body: { url: 'http://127.0.0.1:9/hook' } });
  expect(hook.status).toBe(201);
  // Turning an endpoint off needs no recent sign-in; turning it on again does.
  expect((await s.api('PATCH', `/webhooks/${hook.body.webhook_id}`, { token: u.token, body: { enabled: false } })).status).toBe(200);
  const passkey = await registerPasskey(u.token);
  expect((await s.api('PATCH', `/auth/passkeys/${passkey.passkeyId}`, { token: u.token, body: { active: false } })).status).toBe(200);
  // A challenge begun while the session was fresh must not let an old session complete the registration.
  const pending = await s.api('POST', '/auth/passkeys/register/begin', { token: u.token });
  return {
    keyId: key.body.key_id as string,
    apiKey: key.body.value as string,
    webhookId: hook.body.webhook_id as string,
    passkey,
    pending: pending.body as { challenge_id: string; options: never },
  };
}

const sudoCalls = (t: Awaited<ReturnType<typeof setUp>>, u: User): [string, string, unknown][] => [
  ['POST', '/api-keys/generate', { name: 'another', scopes: ['keys:read'] }],
  ['POST', `/api-keys/${t.keyId}/rotate`, {}],
  ['POST', `/api-keys/${t.keyId}/share`, {}],
  ['POST', '/auth/passkeys/register/begin', undefined],
  [
    'POST',
    '/auth/passkeys/register/complete',
    { challenge_id: t.pending.challenge_id, credential: new SoftAuthenticator({ rpId: 'localhost' }).register(t.pending.options, { origin: ORIGIN }) },
  ],
  ['PATCH', `/auth/passkeys/${t.passkey.passkeyId}`, { active: true }],
  ['POST', '/webhooks', { url: 'http://127.0.0.1:9/other' }],
  ['POST', `/webhooks/${t.webhookId}/rotate-secret`, {}],
  ['PATCH', `/webhooks/${t.webhookId}`, { url: 'http://127.0.0.1:9/moved' }],
  ['PATCH', `/webhooks/${t.webhookId}`, { enabled: true }],
  // Giving another principal access: an invitation, a team link asked for or approved.
  ['POST', '/organization/invitations', { email: `invitee-${u.email}`, role: 'admin' }],
  ['POST', '/team-access/link', { source_user_id: randomUUID() }],
  ['POST', `/team-access/links/${randomUUID()}/approve`, { source_user_id: u.id }],
  // Deciding on what a password reset undid.
  ['POST', `/profile/recovery-review/${randomUUID()}/keep`, undefined],
  ['POST', `/profile/recovery-review/${randomUUID()}/remove`, undefined],
  ['POST', '/partners/rotate-api-key', undefined],
  ['PUT', '/profile/update', { email: `new-${u.email}`, current_password: u.password }],
  ['POST', '/profile/delete-account', { password: u.password }],
];

describe('routes that add a credential need a recent sign-in', () => {
  it('refuses a session older than the window with 403 reauthentication_required, on every such route', async () => {
    const u = await registerUser(s.api);
    const t = await setUp(u);
    clock.advance(s.config.recentSignInSeconds * 1000 + MINUTE);
    for (const [method, path, body] of sudoCalls(t, u)) {
      const res = await s.api(method, path, { token: u.token, body });
      expect(res.status, `${method} ${path}`).toBe(403);
      expect(res.headers.get('content-type'), `${method} ${path}`).toMatch(/^application\/problem\+json/);
      expect(res.body.code, `${method} ${path}`).toBe('reauthentication_required');
    }
    const denied = await s.c.db('audit_logs').where({ user_id: u.id, action: 'sessions.deny' }).whereRaw("details->>'reason' = 'reauthentication_required'");
    expect(denied).toHaveLength(sudoCalls(t, u).length);
    // Nothing happened: no new key, the passkey stays inactive, the email and account stay.
    expect(await s.c.db('api_keys').where({ user_id: u.id })).toHaveLength(1);
    expect(await s.c.db('organization_invitations').where({ invited_by: u.id })).toHaveLength(0);
    expect((await s.c.db('webhook_endpoints').where({ id: t.webhookId }).first()).enabled).toBe(false);
    expect((await s.c.db('passkeys').where({ id: t.passkey.passkeyId }).first()).active).toBe(false);
    expect((await s.api('GET', '/auth/me', { token: u.token })).body.email).toBe(u.email);

    // Other changes do not need one: the company name, a passkey's or a webhook's description, reading keys.
    expect((await s.api('PUT', '/profile/update', { token: u.token, body: { company_name: 'Other' } })).status).toBe(200);
    expect((await s.api('PATCH', `/auth/passkeys/${t.passkey.passkeyId}`, { token: u.token, body: { name: 'Old laptop' } })).status).toBe(200);
    expect((await s.api('PATCH', `/webhooks/${t.webhookId}`, { token: u.token, body: { description: 'renamed' } })).status).toBe(200);
    expect((await s.api('GET', '/api-keys', { token: u.token })).status).toBe(200);
    // An API key is not a session: it has no sign-in to be old (and it ends at a password reset).
    expect((await s.api('POST', '/webhooks', { token: t.apiKey, body: { url: 'http://127.0.0.1:9/by-key' } })).status).toBe(201);
  });

  it('passes a session within the window, and signing in again by password or passkey gives one that passes', async () => {
    const u = await registerUser(s.api);
    const { passkey } = await setUp(u);
    expect((await s.api('PATCH', `/auth/passkeys/${passkey.passkeyId}`, { token: u.token, body: { active: true } })).status).toBe(200);
    clock.advance(s.config.recentSignInSeconds * 1000 - MINUTE);
    expect((await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'in time', scopes: ['keys:read'] } })).status).toBe(201);
    clock.advance(2 * MINUTE);
    expect((await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'too late', scopes: ['keys:read'] } })).status).toBe(403);

    const byPassword = await login(s.api, u);
    expect((await s.api('POST', '/api-keys/generate', { token: byPassword, body: { name: 'after password', scopes: ['keys:read'] } })).status).toBe(201);

    const begun = await s.api('POST', '/auth/passkeys/login/begin', { body: {} });
    const signedIn = await s.api('POST', '/auth/passkeys/login/complete', {
      body: { challenge_id: begun.body.challenge_id, credential: passkey.auth.assert(begun.body.options, { origin: ORIGIN }) },
    });
    expect(signedIn.status).toBe(200);
    expect((await s.api('POST', '/webhooks', { token: signedIn.body.session.token, body: { url: 'http://127.0.0.1:9/after-passkey' } })).status).toBe(201);
  });

  it('answers a password change with a fresh session (the change checked the password)', async () => {
    const u = await registerUser(s.api);
    clock.advance(s.config.recentSignInSeconds * 1000 + MINUTE);
    // The change itself checks the current password: the session it answers is a fresh sign-in.
    const changed = await s.api('POST', '/profile/change-password', {
      token: u.token,
      body: { current_password: u.password, new_password: 'a brand new password' },
    });
    expect(changed.status).toBe(200);
    expect(
      (await s.api('POST', '/api-keys/generate', { token: changed.body.session.token, body: { name: 'after change', scopes: ['keys:read'] } })).status,
    ).toBe(201);
  });

  it('declares the rule in the OpenAPI document of exactly those routes', () => {
    const doc = openApiDocument(routes, { title: 'test', version: '1.0.0', serverUrl: 'http://localhost/api/v1' }) as unknown as {
      paths: Record<string, Record<string, Record<string, unknown>>>;
    };
    const marked = Object.entries(doc.paths).flatMap(([path, item]) =>
      Object.entries(item)
        .filter(([, op]) => op['x-recent-sign-in'])
        .map(([method]) => `${method.toUpperCase()} ${path}`),
    );
    expect(marked.sort()).toEqual(
      [
        'POST /api-keys/generate',
        'POST /api-keys/{key_id}/rotate',
        'POST /api-keys/{key_id}/share',
        'POST /auth/passkeys/register/begin',
        'POST /auth/passkeys/register/complete',
        'PATCH /auth/passkeys/{passkey_id}',
        'POST /webhooks',
        'POST /webhooks/{webhook_id}/rotate-secret',
        'PATCH /webhooks/{webhook_id}',
        'POST /organization/invitations',
        'POST /team-access/link',
        'POST /team-access/links/{grantee_user_id}/approve',
        'POST /profile/recovery-review/{item_id}/keep',
        'POST /profile/recovery-review/{item_id}/remove',
        'POST /partners/rotate-api-key',
        'PUT /profile/update',
        'POST /profile/delete-account',
      ].sort(),
    );
    const op = doc.paths['/api-keys/generate'].post;
    expect(op.description).toMatch(/signed in within/i);
  });
});
