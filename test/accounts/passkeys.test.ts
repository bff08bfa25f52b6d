import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../lib/config';
import { registerUser, startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { startSmtpServer } from '../support/smtp';
import { SoftAuthenticator } from '../support/webauthn';

/**
 * Passkey flows against the real service, with a software authenticator (ES256, 'none' attestation)
 * that builds what a browser sends, so each check can be made to fail on purpose.
 */
const ORIGIN = 'http://localhost:4173';
const RP_ID = 'localhost';
const MAX_FAILURES = 3;

let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;

beforeAll(async () => {
  smtp = await startSmtpServer();
  s = await startTestService({
    env: {
      SMTP_URL: smtp.url,
      WEBAUTHN_ORIGINS: ORIGIN,
      WEBAUTHN_RP_NAME: 'KMS test',
      LOGIN_MAX_FAILURES: String(MAX_FAILURES),
      ADMIN_EMAILS: 'passkey-admin@example.test',
    },
  });
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

type User = Awaited<ReturnType<typeof registerUser>>;

async function beginRegistration(u: User) {
  const res = await s.api('POST', '/auth/passkeys/register/begin', { token: u.token });
  expect(res.status).toBe(200);
  return res.body as { challenge_id: string; expires_at: string; options: { challenge: string; user: { id: string }; excludeCredentials?: { id: string }[] } };
}

/** Registers a new software passkey for the user; answers the authenticator and the passkey row. */
async function addPasskey(u: User, name?: string) {
  const auth = new SoftAuthenticator({ rpId: RP_ID });
  const begun = await beginRegistration(u);
  const res = await s.api('POST', '/auth/passkeys/register/complete', {
    token: u.token,
    body: { challenge_id: begun.challenge_id, credential: auth.register(begun.options, { origin: ORIGIN }), name },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return { auth, passkey: res.body as { passkey_id: string; name: string; active: boolean } };
}

async function beginLogin(username?: string) {
  const res = await s.api('POST', '/auth/passkeys/login/begin', { body: username === undefined ? {} : { username } });
  expect(res.status).toBe(200);
  return res.body as {
    challenge_id: string;
    options: { challenge: string; rpId: string; allowCredentials?: { id: string; transports?: string[] }[]; userVerification: string };
  };
}

async function login(auth: SoftAuthenticator, over: Parameters<SoftAuthenticator['assert']>[1] = { origin: ORIGIN }, username?: string) {
  const begun = await beginLogin(username);
  return s.api('POST', '/auth/passkeys/login/complete', { body: { challenge_id: begun.challenge_id, credential: auth.assert(begun.options, over) } });
}

const auditRows = (userId: string, action: string) => s.c.db('audit_logs').where({ user_id: userId, action }).orderBy('id');
const lastFailure = async (userId: string) => (await auditRows(userId, 'sessions.login')).filter((r) => r.status === 'failure').at(-1)?.details;

describe('passkey registration and login', () => {
  it('applies ADMIN_EMAILS to a verified email on passkey login, as password login does', async () => {
    const u = await registerUser(s.api, { email: 'passkey-admin@example.test' });
    const { auth } = await addPasskey(u);
    expect((await login(auth)).body.user.role).toBe('user'); // unverified: never promoted
    await s.c.db('users').where({ id: u.id }).update({ email_verified_at: new Date() });
    const res = await login(auth);
    expect(res.status).toBe(200);
    expect(res.body.user.role).toBe('admin');
    expect(await auditRows(u.id, 'users.promote')).toHaveLength(1);
  });

  it('registers a passkey (audited, event, email), logs in with it without a username, and the JWT works on /auth/me', async () => {
    const u = await registerUser(s.api);
    const begun = await beginRegistration(u);
    expect(begun.options).toMatchObject({
      rp: { id: RP_ID, name: 'KMS test' },
      user: { name: u.username },
      authenticatorSelection: { userVerification: 'required' },
      attestation: 'none',
    });
    expect(begun.challenge_id).toMatch(/^[A-Za-z0-9_-]{43}$/);

    const auth = new SoftAuthenticator({ rpId: RP_ID, backupEligible: true });
    const done = await s.api('POST', '/auth/passkeys/register/complete', {
      token: u.token,
      body: { challenge_id: begun.challenge_id, credential: auth.register(begun.options, { origin: ORIGIN }), name: 'Laptop' },
    });
    expect(done.status, JSON.stringify(done.body)).toBe(201);
    expect(done.body).toMatchObject({
      name: 'Laptop',
      active: true,
      device_type: 'multiDevice',
      backed_up: true,
      transports: ['internal', 'hybrid'],
      last_used_at: null,
    });

    const list = await s.api('GET', '/auth/passkeys/list', { token: u.token });
    expect(list.status).toBe(200);
    expect(list.body).toMatchObject({ page: 1, page_size: 20, total: 1, items: [{ passkey_id: done.body.passkey_id, name: 'Laptop' }] });
    // Nothing key-like leaves the service.
    expect(JSON.stringify(list.body)).not.toMatch(/public_key|counter|credential_id/);
    expect(await auditRows(u.id, 'passkeys.add')).toMatchObject([{ status: 'success', target: done.body.passkey_id }]);
    const events = await s.api('GET', '/events/history?types=passkeys.added', { token: u.token });
    expect(events.body.items).toMatchObject([{ type: 'passkeys.added', data: { passkey_id: done.body.passkey_id } }]);
    const mail = await smtp.waitFor(u.email);
    expect(mail.subject).toBe('A passkey was added to your account');
    expect(mail.text).toContain('"Laptop"');

    // Usernameless (discoverable) login: no allowCredentials, user verification required.
    const options = await beginLogin();
    expect(options.options).toMatchObject({ rpId: RP_ID, userVerification: 'required' });
    expect(options.options.allowCredentials ?? []).toEqual([]);
    const res = await s.api('POST', '/auth/passkeys/login/complete', {
      body: { challenge_id: options.challenge_id, credential: auth.assert(options.options, { origin: ORIGIN }) },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ session: { token_type: 'Bearer' }, user: { user_id: u.id, username: u.username }, passkey_id: done.body.passkey_id });
    const me = await s.api('GET', '/auth/me', { token: res.body.session.token });
    expect(me.status).toBe(200);
    expect(me.body).toMatchObject({ user_id: u.id, authenticated_via: 'jwt' });
    // The same kind of session as password login: it manages passkeys too.
    expect((await s.api('GET', '/auth/passkeys/list', { token: res.body.session.token })).body.items[0].last_used_at).not.toBeNull();
    expect((await auditRows(u.id, 'sessions.login')).at(-1)).toMatchObject({ status: 'success', details: { method: 'passkey' } });

    // With a username: that account's passkeys are offered.
    const named = await beginLogin(u.username);
    expect(named.options.allowCredentials?.map((c) => c.id)).toEqual([auth.id]);
    expect(
      (
        await s.api('POST', '/auth/passkeys/login/complete', {
          body: { challenge_id: named.challenge_id, credential: auth.assert(named.options, { origin: ORIGIN }) },
        })
      ).status,
    ).toBe(200);

    // A second registration excludes the credential already there.
    expect((await beginRegistration(u)).options.excludeCredentials?.map((c) => c.id)).toEqual([auth.id]);
  });

  it('answers login/begin in the same shape whether or not the username exists or has passkeys', async () => {
    const withKey = await registerUser(s.api);
    await addPasskey(withKey);
    const without = await registerUser(s.api);
    const shapes = await Promise.all([withKey.username, without.username, 'no-such-user-anywhere'].map(beginLogin));
    for (const b of shapes) {
      expect(Object.keys(b).sort()).toEqual(['challenge_id', 'expires_at', 'options']);
      expect(Object.keys(b.options).sort()).toEqual(Object.keys(shapes[0].options).sort());
      expect(b.options.allowCredentials).toHaveLength(1);
      expect(Object.keys(b.options.allowCredentials![0]).sort()).toEqual(['id', 'transports', 'type']);
    }
    // A stand-in is stable for a name, so asking twice does not tell it apart either.
    expect((await beginLogin('NO-SUCH-USER-ANYWHERE')).options.allowCredentials).toEqual(shapes[2].options.allowCredentials);
    expect(shapes[1].options.allowCredentials).not.toEqual(shapes[2].options.allowCredentials);
  });
});

describe('challenges', () => {
  it('are single use: a replayed registration or login challenge is refused', async () => {
    const u = await registerUser(s.api);
    const auth = new SoftAuthenticator({ rpId: RP_ID });
    const begun = await beginRegistration(u);
    const credential = auth.register(begun.options, { origin: ORIGIN });
    expect((await s.api('POST', '/auth/passkeys/register/complete', { token: u.token, body: { challenge_id: begun.challenge_id, credential } })).status).toBe(
      201,
    );
    const again = await s.api('POST', '/auth/passkeys/register/complete', { token: u.token, body: { challenge_id: begun.challenge_id, credential } });
    expect(again.status).toBe(400);
    expect(again.body.code).toBe('challenge_not_found');

    const login = await beginLogin();
    const assertion = auth.assert(login.options, { origin: ORIGIN });
    expect((await s.api('POST', '/auth/passkeys/login/complete', { body: { challenge_id: login.challenge_id, credential: assertion } })).status).toBe(200);
    const replay = await s.api('POST', '/auth/passkeys/login/complete', { body: { challenge_id: login.challenge_id, credential: assertion } });
    expect(replay.status).toBe(400);
    expect(replay.body.code).toBe('challenge_not_found');
    // A fresh challenge with the old assertion: the signature covers the old challenge.
    const fresh = await beginLogin();
    expect((await s.api('POST', '/auth/passkeys/login/complete', { body: { challenge_id: fresh.challenge_id, credential: assertion } })).status).toBe(401);
    expect(await lastFailure(u.id)).toMatchObject({ reason: 'wrong_challenge' });
    // A login challenge does not register, nor a made-up id.
    const wrongCeremony = await s.api('POST', '/auth/passkeys/register/complete', {
      token: u.token,
      body: { challenge_id: (await beginLogin()).challenge_id, credential },
    });
    expect(wrongCeremony.body.code).toBe('challenge_not_found');
    const bogus = await s.api('POST', '/auth/passkeys/login/complete', { body: { challenge_id: 'x'.repeat(43), credential: assertion } });
    expect([bogus.status, bogus.body.code]).toEqual([400, 'challenge_not_found']);
  });

  it('expire after WEBAUTHN_CHALLENGE_TTL_SECONDS by the service clock', async () => {
    const u = await registerUser(s.api);
    const { auth } = await addPasskey(u);
    const reg = await beginRegistration(u);
    const login = await beginLogin();
    const clock = s.c.clock as ManualClockFollowingTime;
    clock.advance((s.config.webauthn.challengeTtlSeconds + 1) * 1000);
    try {
      const r = await s.api('POST', '/auth/passkeys/register/complete', {
        token: u.token,
        body: { challenge_id: reg.challenge_id, credential: new SoftAuthenticator({ rpId: RP_ID }).register(reg.options, { origin: ORIGIN }) },
      });
      expect([r.status, r.body.code]).toEqual([400, 'challenge_expired']);
      const l = await s.api('POST', '/auth/passkeys/login/complete', {
        body: { challenge_id: login.challenge_id, credential: auth.assert(login.options, { origin: ORIGIN }) },
      });
      expect([l.status, l.body.code]).toEqual([400, 'challenge_expired']);
    } finally {
      clock.advance(-(s.config.webauthn.challengeTtlSeconds + 1) * 1000);
    }
  });

  it("are bound to their account: another user's registration challenge is refused, and so is an attestation over it", async () => {
    const a = await registerUser(s.api);
    const b = await registerUser(s.api);
    const aBegun = await beginRegistration(a);
    const auth = new SoftAuthenticator({ rpId: RP_ID });
    const stolen = await s.api('POST', '/auth/passkeys/register/complete', {
      token: b.token,
      body: { challenge_id: aBegun.challenge_id, credential: auth.register(aBegun.options, { origin: ORIGIN }) },
    });
    expect([stolen.status, stolen.body.code]).toEqual([400, 'challenge_not_found']);
    expect((await auditRows(b.id, 'passkeys.add')).at(-1)).toMatchObject({ status: 'failure', details: { reason: 'challenge_of_another_account' } });
    // B's own challenge id, but the attestation signs A's challenge.
    const bBegun = await beginRegistration(b);
    const aBegun2 = await beginRegistration(a);
    const crossed = await s.api('POST', '/auth/passkeys/register/complete', {
      token: b.token,
      body: { challenge_id: bBegun.challenge_id, credential: auth.register(aBegun2.options, { origin: ORIGIN }) },
    });
    expect([crossed.status, crossed.body.code]).toEqual([422, 'passkey_verification_failed']);
    expect(crossed.body.detail).not.toContain(aBegun2.options.challenge);
    expect((await auditRows(b.id, 'passkeys.add')).at(-1)).toMatchObject({ details: { reason: 'wrong_challenge' } });
    expect((await s.api('GET', '/auth/passkeys/list', { token: b.token })).body.total).toBe(0);
  });
});

describe('refused responses', () => {
  const cases = [
    { what: 'a wrong origin', over: { origin: 'http://evil.localhost:4173' }, reason: 'wrong_origin' },
    { what: 'a wrong RP id', over: { origin: ORIGIN, rpId: 'evil.example' }, reason: 'wrong_rp_id' },
    { what: 'no user verification', over: { origin: ORIGIN, userVerified: false }, reason: 'user_verification_missing' },
    { what: 'the wrong ceremony type', over: { origin: ORIGIN, type: 'webauthn.get' }, reason: 'wrong_type' },
  ];

  for (const c of cases) {
    it(`registration with ${c.what} is refused and audited`, async () => {
      const u = await registerUser(s.api);
      const begun = await beginRegistration(u);
      const res = await s.api('POST', '/auth/passkeys/register/complete', {
        token: u.token,
        body: { challenge_id: begun.challenge_id, credential: new SoftAuthenticator({ rpId: RP_ID }).register(begun.options, c.over) },
      });
      expect([res.status, res.body.code]).toEqual([422, 'passkey_verification_failed']);
      expect((await auditRows(u.id, 'passkeys.add')).at(-1)).toMatchObject({ status: 'failure', details: { reason: c.reason } });
      expect((await s.api('GET', '/auth/passkeys/list', { token: u.token })).body.total).toBe(0);
    });
  }

  for (const c of cases.filter((x) => x.reason !== 'wrong_type')) {
    it(`login with ${c.what} is refused (401), audited with the reason, and the passkey still works`, async () => {
      const u = await registerUser(s.api);
      const { auth } = await addPasskey(u);
      const res = await login(auth, c.over);
      expect([res.status, res.body.code]).toEqual([401, 'passkey_login_failed']);
      expect(await lastFailure(u.id)).toMatchObject({ method: 'passkey', reason: c.reason });
      expect((await login(auth)).status).toBe(200);
    });
  }

  it('refuses a signature counter that does not move forward, audited as a possible clone', async () => {
    const u = await registerUser(s.api);
    const { auth, passkey } = await addPasskey(u);
    expect((await login(auth, { origin: ORIGIN, counter: 5 })).status).toBe(200);
    for (const counter of [3, 5]) {
      const res = await login(auth, { origin: ORIGIN, counter });
      expect(res.status).toBe(401);
      expect(await lastFailure(u.id)).toMatchObject({ reason: 'counter_not_increased' });
    }
    expect(await auditRows(u.id, 'passkeys.suspect_clone')).toMatchObject([
      { status: 'failure', target: passkey.passkey_id, details: { stored_counter: 5 } },
      { status: 'failure', target: passkey.passkey_id, details: { stored_counter: 5 } },
    ]);
    expect((await login(auth, { origin: ORIGIN, counter: 6 })).status).toBe(200);
    // Authenticators without a counter send 0 every time: allowed while the stored one is 0 as well.
    const zero = await addPasskey(u);
    expect((await login(zero.auth, { origin: ORIGIN, counter: 0 })).status).toBe(200);
    expect((await login(zero.auth, { origin: ORIGIN, counter: 0 })).status).toBe(200);
  });

  it('refuses a passkey of another account when begin named an account, and a wrong user handle', async () => {
    const a = await registerUser(s.api);
    const b = await registerUser(s.api);
    const { auth } = await addPasskey(a);
    await addPasskey(b);
    expect((await login(auth, { origin: ORIGIN }, b.username)).status).toBe(401);
    expect(await lastFailure(a.id)).toMatchObject({ reason: 'credential_of_another_account' });
    expect((await login(auth, { origin: ORIGIN, userHandle: Buffer.alloc(16, 7).toString('base64url') })).status).toBe(401);
    expect(await lastFailure(a.id)).toMatchObject({ reason: 'user_handle_mismatch' });
  });

  it('refuses malformed credentials with 422 before anything is checked', async () => {
    const begun = await beginLogin();
    for (const credential of [
      {},
      { id: 'a b', rawId: 'x', type: 'public-key', response: {} },
      { id: 'abc', rawId: 'abc', type: 'password', response: { clientDataJSON: 'a', authenticatorData: 'a', signature: 'a' } },
    ]) {
      const res = await s.api('POST', '/auth/passkeys/login/complete', { body: { challenge_id: begun.challenge_id, credential } });
      expect([res.status, res.body.code]).toEqual([422, 'validation_failed']);
    }
    // Well-formed JSON around garbage bytes: refused as a failed login, not a 500.
    const res = await s.api('POST', '/auth/passkeys/login/complete', {
      body: {
        challenge_id: begun.challenge_id,
        credential: {
          id: 'AAAA',
          rawId: 'AAAA',
          type: 'public-key',
          response: { clientDataJSON: 'AAAA', authenticatorData: 'AAAA', signature: 'AAAA' },
          clientExtensionResults: {},
        },
      },
    });
    expect(res.status).toBe(401);
  });
});

describe('managing passkeys', () => {
  it('renames, deactivates (no login) and reactivates a passkey; deleting it ends its logins (event passkeys.removed)', async () => {
    const u = await registerUser(s.api);
    const { auth, passkey } = await addPasskey(u, 'Phone');
    const path = `/auth/passkeys/${passkey.passkey_id}`;

    const renamed = await s.api('PATCH', path, { token: u.token, body: { name: '  Work phone ' } });
    expect(renamed.status).toBe(200);
    expect(renamed.body).toMatchObject({ name: 'Work phone', active: true });

    expect((await s.api('PATCH', path, { token: u.token, body: { active: false } })).body.active).toBe(false);
    expect((await login(auth)).status).toBe(401);
    expect(await lastFailure(u.id)).toMatchObject({ reason: 'passkey_inactive' });
    // An inactive passkey is not offered for a named login either.
    expect((await beginLogin(u.username)).options.allowCredentials?.map((c) => c.id)).not.toContain(auth.id);
    expect((await s.api('PATCH', path, { token: u.token, body: { active: true } })).body.active).toBe(true);
    expect((await login(auth)).status).toBe(200);
    expect((await auditRows(u.id, 'passkeys.update')).map((r) => r.details)).toEqual([{ name: 'Work phone' }, { active: false }, { active: true }]);

    expect((await s.api('DELETE', path, { token: u.token })).status).toBe(204);
    // Deleting it again is harmless, as revoking a share or an API key again is: nothing more happens.
    expect((await s.api('DELETE', path, { token: u.token })).status).toBe(204);
    expect(await auditRows(u.id, 'passkeys.remove')).toHaveLength(1);
    // A deleted credential is unknown: the failure is audited without an account.
    const unknown = () =>
      s.c
        .db('audit_logs')
        .whereNull('user_id')
        .where({ action: 'sessions.login' })
        .whereRaw(`details->>'reason' = 'unknown_credential'`)
        .count<{ count: string }[]>({ count: '*' });
    const before = Number((await unknown())[0].count);
    expect((await login(auth)).status).toBe(401);
    expect(Number((await unknown())[0].count)).toBe(before + 1);
    expect((await s.api('GET', '/auth/passkeys/list', { token: u.token })).body.total).toBe(0);
    const events = await s.api('GET', '/events/history?types=passkeys.removed', { token: u.token });
    expect(events.body.items).toMatchObject([{ type: 'passkeys.removed', data: { passkey_id: passkey.passkey_id } }]);
    expect(await auditRows(u.id, 'passkeys.remove')).toMatchObject([{ status: 'success', target: passkey.passkey_id }]);
  });

  it('takes the state in words (active or inactive), and says which fields an empty or contradictory change may name', async () => {
    const u = await registerUser(s.api);
    const { auth, passkey } = await addPasskey(u);
    const path = `/auth/passkeys/${passkey.passkey_id}`;
    const inactive = await s.api('PATCH', path, { token: u.token, body: { state: 'inactive' } });
    expect([inactive.status, inactive.body.active]).toEqual([200, false]);
    expect((await login(auth)).status).toBe(401);
    expect((await s.api('PATCH', path, { token: u.token, body: { state: 'active' } })).body.active).toBe(true);
    expect((await login(auth)).status).toBe(200);
    const empty = await s.api('PATCH', path, { token: u.token, body: {} });
    expect([empty.status, empty.body.code]).toEqual([422, 'validation_failed']);
    expect(JSON.stringify(empty.body.errors)).toContain('name, active (true or false) or state (active or inactive)');
    const both = await s.api('PATCH', path, { token: u.token, body: { active: true, state: 'inactive' } });
    expect([both.status, both.body.errors]).toEqual([422, [{ path: 'body.state', message: 'active and state disagree: give one' }]]);
    const word = await s.api('PATCH', path, { token: u.token, body: { state: 'disabled' } });
    expect([word.status, word.body.errors?.[0]?.path]).toEqual([422, 'body.state']);
  });

  it("answers 404 for another account's passkey id (audited for the caller) and leaves it alone", async () => {
    const a = await registerUser(s.api);
    const b = await registerUser(s.api);
    const { auth, passkey } = await addPasskey(a);
    const path = `/auth/passkeys/${passkey.passkey_id}`;
    for (const [method, body] of [
      ['PATCH', { active: false }],
      ['DELETE', undefined],
    ] as const) {
      const res = await s.api(method, path, { token: b.token, body });
      expect([res.status, res.body.code]).toEqual([404, 'passkey_not_found']);
    }
    const missing = await s.api('PATCH', '/auth/passkeys/00000000-0000-4000-8000-000000000000', { token: b.token, body: { name: 'x' } });
    expect([missing.status, missing.body.code]).toEqual([404, 'passkey_not_found']);
    expect(await auditRows(b.id, 'passkeys.deny_access')).toMatchObject([
      { status: 'failure', target: passkey.passkey_id, details: { reason: 'not_owner' } },
      { status: 'failure', target: passkey.passkey_id, details: { reason: 'not_owner' } },
    ]);
    expect((await s.api('GET', '/auth/passkeys/list', { token: b.token })).body.total).toBe(0);
    expect((await login(auth)).status).toBe(200);
  });

  it('needs a session: the partner API key is refused (403 session_required) on every passkey route', async () => {
    const u = await registerUser(s.api);
    const { passkey } = await addPasskey(u);
    const path = `/auth/passkeys/${passkey.passkey_id}`;
    const calls = [
      ['PATCH', path, { name: 'stolen' }],
      ['DELETE', path, undefined],
      ['POST', '/auth/passkeys/register/begin', {}],
      ['POST', '/auth/passkeys/register/complete', { challenge_id: 'x'.repeat(43), credential: {} }],
      ['GET', '/auth/passkeys/list', undefined],
    ] as const;
    for (const [method, p, body] of calls) {
      const res = await s.api(method, p, { token: u.apiKey, body });
      expect([method, p, res.status, res.body.code]).toEqual([method, p, 403, 'session_required']);
    }
    expect((await s.api('GET', '/auth/passkeys/list', { token: u.token })).body.items).toMatchObject([{ name: passkey.name, active: true }]);
    expect((await s.api('POST', '/auth/passkeys/register/begin')).status).toBe(401);
  });

  it('validates changes: at least one field, names of one line', async () => {
    const u = await registerUser(s.api);
    const { passkey } = await addPasskey(u);
    const path = `/auth/passkeys/${passkey.passkey_id}`;
    for (const body of [{}, { name: '' }, { name: 'two\nlines' }, { name: 'x'.repeat(101) }, { active: 'no' }]) {
      const res = await s.api('PATCH', path, { token: u.token, body });
      expect([JSON.stringify(body), res.status]).toEqual([JSON.stringify(body), 422]);
    }
    expect((await s.api('PATCH', '/auth/passkeys/not-a-uuid', { token: u.token, body: { name: 'x' } })).status).toBe(422);
  });
});

describe('limits on passkeys', () => {
  it(`an account has at most ${20} passkeys, also when registrations race`, async () => {
    const u = await registerUser(s.api);
    for (let i = 0; i < 18; i++) await addPasskey(u, `key ${i}`);
    const begun = await Promise.all(Array.from({ length: 4 }, () => beginRegistration(u)));
    const results = await Promise.all(
      begun.map((b) =>
        s.api('POST', '/auth/passkeys/register/complete', {
          token: u.token,
          body: { challenge_id: b.challenge_id, credential: new SoftAuthenticator({ rpId: RP_ID }).register(b.options, { origin: ORIGIN }) },
        }),
      ),
    );
    expect(results.map((r) => r.status).sort()).toEqual([201, 201, 409, 409]);
    expect(results.find((r) => r.status === 409)!.body.code).toBe('passkey_limit_reached');
    expect((await s.api('GET', '/auth/passkeys/list?page_size=5', { token: u.token })).body).toMatchObject({ total: 20, page_size: 5 });
  });

  it('one authenticator credential registers once, in one account', async () => {
    const a = await registerUser(s.api);
    const b = await registerUser(s.api);
    const auth = new SoftAuthenticator({ rpId: RP_ID });
    const first = await beginRegistration(a);
    expect(
      (
        await s.api('POST', '/auth/passkeys/register/complete', {
          token: a.token,
          body: { challenge_id: first.challenge_id, credential: auth.register(first.options, { origin: ORIGIN }) },
        })
      ).status,
    ).toBe(201);
    const second = await beginRegistration(b);
    const dup = await s.api('POST', '/auth/passkeys/register/complete', {
      token: b.token,
      body: { challenge_id: second.challenge_id, credential: auth.register(second.options, { origin: ORIGIN }) },
    });
    expect([dup.status, dup.body.code]).toEqual([409, 'passkey_exists']);
  });
});

describe('the passkey page', () => {
  it('is served with a strict Content-Security-Policy, its script and the WebAuthn browser bundle', async () => {
    const base = s.url.replace(/\/api\/v1$/, '');
    const page = await fetch(`${base}/passkeys`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toMatch(/^text\/html/);
    const csp = page.headers.get('content-security-policy') ?? '';
    expect(csp).toContain("default-src 'none'");
    expect(csp).toContain("script-src 'self'");
    expect(csp).toContain("form-action 'none'");
    expect(csp).not.toMatch(/unsafe/);
    const html = await page.text();
    // Every script is a file of this origin: no inline script, no inline handler.
    expect(html).not.toMatch(/<script(?![^>]*\ssrc=)[^>]*>/);
    expect(html).not.toMatch(/\son[a-z]+=/i);
    const bundle = await fetch(`${base}/passkeys/simplewebauthn-browser.js`);
    expect(bundle.headers.get('content-type')).toMatch(/^text\/javascript/);
    expect(await bundle.text()).toContain('SimpleWebAuthnBrowser');
    const app = await fetch(`${base}/passkeys/app.js`);
    expect(await app.text()).toContain('/auth/passkeys/login/complete');
    expect((await fetch(`${base}/passkeys/../package.json`)).status).toBe(404);
    expect((await fetch(`${base}/passkeys/app.js`, { method: 'POST' })).status).toBe(404);
  });
});

describe('login limits', () => {
  it('parallel failed passkey logins never get more tries than the account limit, which password login shares', async () => {
    const u = await registerUser(s.api);
    const { auth } = await addPasskey(u);
    const begun = await Promise.all(Array.from({ length: 10 }, () => beginLogin()));
    const results = await Promise.all(
      begun.map((b) =>
        s.api('POST', '/auth/passkeys/login/complete', {
          body: { challenge_id: b.challenge_id, credential: auth.assert(b.options, { origin: 'http://evil.localhost' }) },
        }),
      ),
    );
    const statuses = results.map((r) => r.status).sort();
    expect(statuses.filter((x) => x === 401)).toHaveLength(MAX_FAILURES);
    expect(statuses.filter((x) => x === 429)).toHaveLength(10 - MAX_FAILURES);
    expect(results.find((r) => r.status === 429)!.headers.get('retry-after')).toMatch(/^\d+$/);
    // Locked: the right passkey and the right password wait as well.
    expect((await login(auth)).status).toBe(429);
    expect((await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } })).status).toBe(429);
    expect((await auditRows(u.id, 'sessions.login')).filter((r) => r.details.reason === 'locked').length).toBeGreaterThan(0);
  });

  it('refused passkey logins on a locked account add one audit row; the next login after the lock adds one summary', async () => {
    const u = await registerUser(s.api);
    const { auth } = await addPasskey(u);
    for (let i = 0; i < MAX_FAILURES; i++) expect((await login(auth, { origin: 'http://evil.localhost' })).status).toBe(401);
    const before = (await auditRows(u.id, 'sessions.login')).length;
    const begun = await Promise.all(Array.from({ length: 40 }, () => beginLogin()));
    const refused = await Promise.all(
      begun.map((b) =>
        s.api('POST', '/auth/passkeys/login/complete', { body: { challenge_id: b.challenge_id, credential: auth.assert(b.options, { origin: ORIGIN }) } }),
      ),
    );
    expect(refused.every((r) => r.status === 429)).toBe(true);
    expect((await auditRows(u.id, 'sessions.login')).slice(before).map((r) => r.details)).toEqual([{ method: 'passkey', reason: 'locked' }]);

    await s.c.limiters.loginAccount.delete(`user:${u.id}`);
    expect((await login(auth)).status).toBe(200);
    const after = (await auditRows(u.id, 'sessions.login')).slice(before);
    expect(after.map((r) => [r.status, r.details.reason ?? null])).toEqual([
      ['failure', 'locked'],
      ['failure', 'locked'],
      ['success', null],
    ]);
    expect(after[1].details).toMatchObject({ refused: 40 });
  });

  it('a successful passkey login gives its point back', async () => {
    const u = await registerUser(s.api);
    const { auth } = await addPasskey(u);
    for (let i = 0; i < MAX_FAILURES + 2; i++) expect((await login(auth)).status).toBe(200);
  });
});

describe('configuration', () => {
  const secrets = { MASTER_KEY: `p1:${Buffer.alloc(32, 9).toString('base64')}`, JWT_SECRET: 'a production secret of enough length 123' };

  it('derives the RP id and origin from PUBLIC_URL (localhost by default)', () => {
    expect(loadConfig({ NODE_ENV: 'test', PORT: '8080' }).webauthn).toMatchObject({ rpId: 'localhost', origins: ['http://localhost:8080'], rpName: 'KMS' });
    expect(loadConfig({ ...secrets, PUBLIC_URL: 'https://kms.example.com/' }).webauthn).toMatchObject({
      rpId: 'kms.example.com',
      origins: ['https://kms.example.com'],
    });
    expect(
      loadConfig({
        ...secrets,
        PUBLIC_URL: 'https://kms.example.com',
        WEBAUTHN_RP_ID: 'example.com',
        WEBAUTHN_ORIGINS: 'https://kms.example.com,https://app.example.com:8443',
      }).webauthn.origins,
    ).toEqual(['https://kms.example.com', 'https://app.example.com:8443']);
  });

  it('refuses in production an http origin other than localhost, an origin outside the RP id, and an IP RP id', () => {
    expect(() => loadConfig({ ...secrets, PUBLIC_URL: 'http://kms.example.com' })).toThrow(/plain http/);
    expect(() => loadConfig({ ...secrets, WEBAUTHN_RP_ID: 'example.com', WEBAUTHN_ORIGINS: 'https://kms.example.com,http://kms.example.com' })).toThrow(
      /plain http/,
    );
    expect(loadConfig({ ...secrets, PORT: '3000' }).webauthn.origins).toEqual(['http://localhost:3000']);
    expect(() => loadConfig({ ...secrets, WEBAUTHN_RP_ID: 'example.com', WEBAUTHN_ORIGINS: 'https://example.org' })).toThrow(
      /must be the host of every origin/,
    );
    expect(() => loadConfig({ ...secrets, WEBAUTHN_RP_ID: 'ample.com', WEBAUTHN_ORIGINS: 'https://example.com' })).toThrow(/must be the host of every origin/);
    expect(() => loadConfig({ ...secrets, PUBLIC_URL: 'https://10.0.0.5' })).toThrow(/IP address/);
    // Development and test accept them (a developer on 127.0.0.1 still starts; passkeys just will not work there).
    expect(loadConfig({ NODE_ENV: 'development', WEBAUTHN_ORIGINS: 'http://kms.example.com' }).webauthn.origins).toEqual(['http://kms.example.com']);
  });

  it('refuses origins that are not bare origins', () => {
    for (const o of ['https://kms.example.com/app', 'kms.example.com', 'ftp://kms.example.com']) {
      expect(() => loadConfig({ NODE_ENV: 'test', WEBAUTHN_ORIGINS: o })).toThrow(/WEBAUTHN_ORIGINS/);
    }
  });
});
