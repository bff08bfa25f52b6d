import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { login, registerUser, startTestService, type TestService, type ManualClockFollowingTime } from '../support/service';
import { startSmtpServer } from '../support/smtp';
import { SoftAuthenticator } from '../support/webauthn';
import { issuePasswordReset } from '../../lib/accounts/user-accounts';
import { RESET_MAILS_PER_HOUR } from '../../lib/auth/limiters';

const ORIGIN = 'http://localhost:4173';

let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;

beforeAll(async () => {
  smtp = await startSmtpServer();
  s = await startTestService({ env: { SMTP_URL: smtp.url, WEBAUTHN_ORIGINS: ORIGIN } });
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

const tokenFrom = (text: string) => /Reset token: (\S+)/.exec(text)?.[1];

async function requestReset(email: string) {
  const res = await s.api('POST', '/auth/forgot-password', { body: { email } });
  expect(res.status).toBe(202);
  const mail = await takeMail(email, /^Reset your password$/);
  return tokenFrom(mail.text ?? '')!;
}

type User = Awaited<ReturnType<typeof registerUser>>;

/** A managed API key with a share link of it, and a software passkey: the credentials a session can add. */
async function plantCredentials(u: User) {
  const key = await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'ci', scopes: ['keys:read', 'webhooks:write'] } });
  expect(key.status).toBe(201);
  const share = await s.api('POST', `/api-keys/${key.body.key_id}/share`, { token: u.token, body: { max_views: 5 } });
  expect(share.status).toBe(201);
  const auth = new SoftAuthenticator({ rpId: 'localhost' });
  const begun = await s.api('POST', '/auth/passkeys/register/begin', { token: u.token });
  const passkey = await s.api('POST', '/auth/passkeys/register/complete', {
    token: u.token,
    body: { challenge_id: begun.body.challenge_id, credential: auth.register(begun.body.options, { origin: ORIGIN }) },
  });
  expect(passkey.status).toBe(201);
  return { apiKey: key.body.value as string, shareToken: share.body.share_token as string, auth, passkeyId: passkey.body.passkey_id as string };
}

async function passkeyLogin(auth: SoftAuthenticator) {
  const begun = await s.api('POST', '/auth/passkeys/login/begin', { body: {} });
  return s.api('POST', '/auth/passkeys/login/complete', {
    body: { challenge_id: begun.body.challenge_id, credential: auth.assert(begun.body.options, { origin: ORIGIN }) },
  });
}

/** Takes the first mail to `email` whose subject matches out of the inbox. */
async function takeMail(email: string, subject: RegExp) {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const mail = smtp.received.find((m) => JSON.stringify(m.to).includes(email) && subject.test(m.subject ?? ''));
    if (mail) {
      smtp.received.splice(smtp.received.indexOf(mail), 1);
      return mail;
    }
    if (Date.now() > deadline) throw new Error(`no mail "${subject.source}" to ${email}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('password recovery by email', () => {
  it('sends a reset email through the notify worker and SMTP, and the token resets the password once', async () => {
    const u = await registerUser(s.api);
    const token = await requestReset(u.email);
    expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);

    const reset = await s.api('POST', '/auth/reset-password', { body: { token, new_password: 'an entirely new password' } });
    expect(reset.status).toBe(200);
    expect((await s.api('GET', '/auth/me', { token: u.token })).status).toBe(401);
    expect((await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } })).status).toBe(401);
    expect((await s.api('POST', '/auth/login', { body: { identifier: u.username, password: 'an entirely new password' } })).status).toBe(200);

    const again = await s.api('POST', '/auth/reset-password', { body: { token, new_password: 'yet another password' } });
    expect(again.status).toBe(410);
    expect(again.body.code).toBe('reset_token_used');
  });

  it('answers the same for an unknown email and sends nothing', async () => {
    const res = await s.api('POST', '/auth/forgot-password', { body: { email: 'nobody-at-all@example.test' } });
    expect(res.status).toBe(202);
    const known = await registerUser(s.api);
    const res2 = await s.api('POST', '/auth/forgot-password', { body: { email: known.email } });
    expect(res2.body).toEqual(res.body);
    await smtp.waitFor(known.email);
    expect(smtp.received.some((m) => JSON.stringify(m.to).includes('nobody-at-all'))).toBe(false);
  });

  it(`mails an account at most ${RESET_MAILS_PER_HOUR} resets an hour, whoever asks: the requests past it are audited as one row and one summary`, async () => {
    const u = await registerUser(s.api);
    const rows = () => s.c.db('audit_logs').where({ chain: u.id, action: 'passwords.request_reset' }).orderBy('sequence');
    // What the request-password-reset job does for each POST /auth/forgot-password, from addresses without number.
    const ask = (i: number) => issuePasswordReset(s.c, u.email, { ip: `203.0.113.${i % 250}`, requestId: randomUUID(), clientRequestId: `FORGED-${i}` });
    for (let i = 0; i < RESET_MAILS_PER_HOUR + 20; i++) await ask(i);
    for (let i = 0; i < RESET_MAILS_PER_HOUR; i++) await takeMail(u.email, /^Reset your password$/);
    expect((await rows()).map((r) => [r.status, r.details.reason ?? null])).toEqual([
      ...Array.from({ length: RESET_MAILS_PER_HOUR }, () => ['success', null]),
      ['failure', 'rate_limited'],
    ]);
    expect(await s.c.db('password_resets').where({ user_id: u.id })).toHaveLength(RESET_MAILS_PER_HOUR);

    // The hour passes: the next mail sent ends the episode with its count.
    await s.c.limiters.resetMail.delete(u.id);
    await ask(999);
    await takeMail(u.email, /^Reset your password$/);
    const all = await rows();
    expect(all).toHaveLength(RESET_MAILS_PER_HOUR + 3);
    expect(all.at(-2)).toMatchObject({ status: 'failure', details: { reason: 'rate_limited', refused: 20 }, client_request_id: 'FORGED-999' });
    expect(all.at(-1)).toMatchObject({ status: 'success' });
    expect(smtp.received.some((m) => JSON.stringify(m.to).includes(u.email))).toBe(false);
  });

  it('refuses an expired token and an unknown one', async () => {
    const u = await registerUser(s.api);
    const token = await requestReset(u.email);
    const clock = s.c.clock as ManualClockFollowingTime;
    clock.advance((s.config.resetTokenTtlMinutes + 1) * 60_000);
    try {
      const expired = await s.api('POST', '/auth/reset-password', { body: { token, new_password: 'an entirely new password' } });
      expect(expired.status).toBe(410);
      expect(expired.body.code).toBe('reset_token_expired');
    } finally {
      clock.advance(-(s.config.resetTokenTtlMinutes + 1) * 60_000);
    }
    const unknown = await s.api('POST', '/auth/reset-password', { body: { token: 'x'.repeat(43), new_password: 'an entirely new password' } });
    expect(unknown.status).toBe(400);
    expect(unknown.body.code).toBe('invalid_reset_token');
  });

  it('lets only one of two concurrent redemptions of a token win', async () => {
    const u = await registerUser(s.api);
    const token = await requestReset(u.email);
    const results = await Promise.all(
      ['first new password', 'second new password'].map((new_password) => s.api('POST', '/auth/reset-password', { body: { token, new_password } })),
    );
    expect(results.map((r) => r.status).sort()).toEqual([200, 410]);
  });

  it('never stores the token or puts it in Redis in plaintext', async () => {
    const u = await registerUser(s.api);
    const token = await requestReset(u.email);
    const rows = await s.c.db('password_resets').select('token_hash');
    expect(JSON.stringify(rows)).not.toContain(token);
    const keys = await s.c.redis.keys(`*${s.config.redisPrefix}*`);
    for (const key of keys) {
      const type = await s.c.redis.type(key);
      const dump = type === 'hash' ? JSON.stringify(await s.c.redis.hgetall(key)) : type === 'string' ? await s.c.redis.get(key) : '';
      expect(dump ?? '').not.toContain(token);
    }
    const audit = await s.c.db('audit_logs').select('details');
    expect(JSON.stringify(audit)).not.toContain(token);
  });

  it('ends every credential but the new password: sessions, partner key, managed keys and their links; passkeys are deactivated', async () => {
    const u = await registerUser(s.api);
    const planted = await plantCredentials(u);
    expect((await s.api('GET', '/keys/list', { token: planted.apiKey })).status).toBe(200);
    const token = await requestReset(u.email);

    expect((await s.api('POST', '/auth/reset-password', { body: { token, new_password: 'an entirely new password' } })).status).toBe(200);

    expect((await s.api('GET', '/auth/me', { token: u.token })).status).toBe(401);
    expect((await s.api('GET', '/auth/me', { token: u.apiKey })).status).toBe(401);
    for (const path of ['/keys/list', '/webhooks']) {
      const res = await s.api('GET', path, { token: planted.apiKey });
      expect(res.status).toBe(401);
      expect(res.body.code).toBe('api_key_revoked');
    }
    const view = await s.api('GET', `/api-keys/shared/${planted.shareToken}`);
    expect(view.status).toBe(410);
    expect(view.body.code).toBe('share_revoked');
    const refused = await passkeyLogin(planted.auth);
    expect(refused.status).toBe(401);
    expect(refused.body.code).toBe('passkey_login_failed');

    const mail = await takeMail(u.email, /password was reset/i);
    expect(mail.text).toMatch(/1 managed API key/);
    expect(mail.text).toMatch(/1 API key share link/);
    expect(mail.text).toMatch(/1 passkey/);
    expect(mail.text).toMatch(/partner API key/);
    expect(mail.text).not.toContain(planted.apiKey);

    const audit = await s.c.db('audit_logs').where({ user_id: u.id, action: 'passwords.reset', status: 'success' }).first();
    expect(audit.details).toMatchObject({ partner_keys_revoked: 1, api_keys_revoked: 1, api_key_shares_revoked: 1, passkeys_deactivated: 1 });
    expect(await s.c.db('audit_logs').where({ user_id: u.id, action: 'api_keys.revoke' })).toHaveLength(1);

    // The owner signs in with the new password and re-enables the passkey she recognises.
    const session = await login(s.api, { username: u.username, password: 'an entirely new password' });
    const listed = await s.api('GET', '/auth/passkeys/list', { token: session });
    expect(listed.body.items.map((p: { active: boolean }) => p.active)).toEqual([false]);
    expect((await s.api('PATCH', `/auth/passkeys/${planted.passkeyId}`, { token: session, body: { active: true } })).status).toBe(200);
    expect((await passkeyLogin(planted.auth)).status).toBe(200);
  });

  it('a password change with the current password keeps managed keys, share links and passkeys, and mails a confirmation', async () => {
    const u = await registerUser(s.api);
    const planted = await plantCredentials(u);
    const changed = await s.api('POST', '/profile/change-password', {
      token: u.token,
      body: { current_password: u.password, new_password: 'an entirely new password' },
    });
    expect(changed.status).toBe(200);
    expect((await s.api('GET', '/keys/list', { token: planted.apiKey })).status).toBe(200);
    expect((await s.api('GET', `/api-keys/shared/${planted.shareToken}`)).status).toBe(200);
    expect((await passkeyLogin(planted.auth)).status).toBe(200);
    const mail = await takeMail(u.email, /password was changed/i);
    expect(mail.text).toMatch(/API keys and passkeys stay/);
  });
});
