import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SignJWT } from 'jose';
import type { AddressInfo } from 'node:net';
import { randomUUID } from 'node:crypto';
import { createApp } from '../../api/app';
import { hashPassword } from '../../lib/auth/passwords';
import { registerUser, startTestService, type TestService } from '../support/service';
import { startSmtpServer } from '../support/smtp';
import { captureLogs } from '../support/logs';

/**
 * Guess limits that hold under parallel requests, client addresses that cannot be forged, session tokens
 * that must be ours and fresh, credentials that cannot take over an account.
 */
let s: TestService;
let behindProxy: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;

beforeAll(async () => {
  smtp = await startSmtpServer();
  s = await startTestService({ env: { SMTP_URL: smtp.url, ADMIN_EMAILS: 'chief@example.test', LOGIN_IP_MAX_FAILURES: '1000' } });
  behindProxy = await startTestService({ roles: ['web'], env: { TRUSTED_PROXY_COUNT: '1', LOGIN_IP_MAX_FAILURES: '3' } });
});
afterAll(async () => {
  await s?.stop();
  await behindProxy?.stop();
  await smtp?.close();
});

const statuses = (answers: { status: number }[]) => answers.reduce<Record<number, number>>((n, a) => ({ ...n, [a.status]: (n[a.status] ?? 0) + 1 }), {});
const failures = async (userId: string, action: string) =>
  (await s.c.db('audit_logs').where({ user_id: userId, action, status: 'failure' })).filter(
    (r: { details: { reason: string } }) => r.details.reason === 'wrong_password',
  ).length;

describe('password guessing', () => {
  it('40 parallel wrong logins get exactly LOGIN_MAX_FAILURES checks; the rest are 429 without one', async () => {
    const u = await registerUser(s.api);
    const answers = await Promise.all(
      Array.from({ length: 40 }, () => s.api('POST', '/auth/login', { body: { identifier: u.username, password: 'wrong password guess' } })),
    );
    expect(statuses(answers)).toEqual({ 401: 5, 429: 35 });
    expect(await failures(u.id, 'sessions.login')).toBe(5);
    // Locked: the right password is refused too until the lock ends.
    expect((await s.api('POST', '/auth/login', { body: { identifier: u.email, password: u.password } })).status).toBe(429);
  });

  it('counts username and email against one lockout: the account', async () => {
    const u = await registerUser(s.api);
    const answers = [];
    for (let i = 0; i < 10; i++)
      answers.push(await s.api('POST', '/auth/login', { body: { identifier: i % 2 ? u.email : u.username, password: 'wrong password guess' } }));
    expect(statuses(answers)).toEqual({ 401: 5, 429: 5 });
  });

  it('an unknown identifier costs a point under its normalized form (case and spaces do not make new budgets)', async () => {
    const ghost = `Ghost_${Date.now()}`;
    const answers = [];
    for (let i = 0; i < 7; i++) {
      const identifier = [ghost, ghost.toLowerCase(), ghost.toUpperCase(), ` ${ghost} `][i % 4];
      answers.push(await s.api('POST', '/auth/login', { body: { identifier, password: 'wrong password guess' } }));
    }
    expect(statuses(answers)).toEqual({ 401: 5, 429: 2 });
  });

  it('a correct password gets its point back and clears the failures: honest logins never lock an account', async () => {
    const u = await registerUser(s.api);
    const login = (password: string) => s.api('POST', '/auth/login', { body: { identifier: u.username, password } });
    const answers = [];
    for (let i = 0; i < 8; i++) answers.push(await login(u.password));
    for (let i = 0; i < 4; i++) answers.push(await login('wrong password guess'));
    answers.push(await login(u.password));
    for (let i = 0; i < 4; i++) answers.push(await login('wrong password guess'));
    expect(statuses(answers)).toEqual({ 200: 9, 401: 8 });
  });

  it('change-password and delete-account share the lockout, also in parallel', async () => {
    const u = await registerUser(s.api);
    const answers = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        i % 2
          ? s.api('POST', '/profile/change-password', {
              token: u.token,
              body: { current_password: 'wrong password guess', new_password: 'a brand new password' },
            })
          : s.api('POST', '/profile/delete-account', { token: u.token, body: { password: 'wrong password guess' } }),
      ),
    );
    expect(statuses(answers)).toEqual({ 403: 5, 429: 7 });
    expect((await s.api('GET', '/auth/me', { token: u.token })).status).toBe(200);
  });
});

/** Serves createApp(config) of the test container on a free port: the real app with another proxy setting. */
async function withApp<T>(config: Partial<TestService['config']>, fn: (url: string) => Promise<T>): Promise<T> {
  const app = createApp({ ...s.c, config: { ...s.c.config, ...config } });
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  try {
    return await fn(`http://127.0.0.1:${(server.address() as AddressInfo).port}/api/v1`);
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
}

/** The client address the API recorded for one failed login sent with this X-Forwarded-For. */
async function recordedIp(url: string, xff: string): Promise<string> {
  const requestId = randomUUID();
  const res = await fetch(`${url}/auth/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-forwarded-for': xff, 'x-request-id': requestId },
    body: JSON.stringify({ identifier: `nobody-${requestId}`, password: 'wrong password guess' }),
  });
  expect(res.status).toBe(401);
  return (await s.c.db('audit_logs').where({ client_request_id: requestId, action: 'sessions.login' }).first()).ip;
}

describe('client addresses', () => {
  it('in production too, TRUSTED_PROXY_COUNT=0 ignores X-Forwarded-For; N trusts the right-most N entries only', async () => {
    await withApp({ production: true, trustedProxyCount: 0 }, async (url) => {
      expect(await recordedIp(url, '203.0.113.9')).not.toContain('203.0.113.9');
    });
    await withApp({ production: true, trustedProxyCount: 2 }, async (url) => {
      // client-forged, client as seen by the outer proxy, outer proxy as seen by the inner one
      expect(await recordedIp(url, '203.0.113.9, 198.51.100.20, 192.0.2.1')).toBe('198.51.100.20');
      expect(await recordedIp(url, '192.0.2.1')).toBe('192.0.2.1');
    });
  });

  it('ignore X-Forwarded-For unless TRUSTED_PROXY_COUNT says how many proxies to trust', async () => {
    const u = await registerUser(s.api);
    await s.api('POST', '/auth/login', { headers: { 'x-forwarded-for': '203.0.113.9' }, body: { identifier: u.username, password: u.password } });
    const row = await s.c.db('audit_logs').where({ user_id: u.id, action: 'sessions.login' }).first();
    expect(row.ip).not.toContain('203.0.113.9');
  });

  it('behind one trusted proxy take its right-most entry: a forged left-most entry changes nothing', async () => {
    // The proxy appends the address it saw (here always the same client); the client forges the rest.
    const answers = [];
    for (let i = 0; i < 5; i++) {
      answers.push(
        await behindProxy.api('POST', '/auth/login', {
          headers: { 'x-forwarded-for': `198.51.100.${i}, 192.0.2.7` },
          body: { identifier: `nobody-${i}`, password: 'wrong password guess' },
        }),
      );
    }
    expect(statuses(answers)).toEqual({ 401: 3, 429: 2 });
    const row = await behindProxy.c.db('audit_logs').where({ action: 'sessions.login' }).first();
    expect(row.ip).toBe('192.0.2.7');
  });
});

describe('session tokens', () => {
  const secret = () => new TextEncoder().encode(s.config.jwt.secret);
  const forge = async (
    u: { id: string },
    edit: (jwt: SignJWT) => SignJWT,
    typ = 'kms-session+jwt',
    claims: Record<string, unknown> = { auth_time: Math.floor(Date.now() / 1000) },
  ) =>
    edit(
      new SignJWT({ role: 'user', tv: 0, ...claims }).setProtectedHeader({ alg: 'HS256', typ }).setSubject(u.id).setIssuer('kms').setAudience('kms-api'),
    ).sign(secret());

  it('must carry exp, iat, sub and auth_time, our typ, and not be issued in the future or live too long', async () => {
    const u = await registerUser(s.api);
    const now = Math.floor(Date.now() / 1000);
    const good = await forge(u, (j) => j.setIssuedAt(now).setExpirationTime(now + 600));
    expect((await s.api('GET', '/auth/me', { token: good })).status).toBe(200);
    const bad = {
      noExp: await forge(u, (j) => j.setIssuedAt(now)),
      noIat: await forge(u, (j) => j.setExpirationTime(now + 600)),
      future: await forge(u, (j) => j.setIssuedAt(now + 365 * 86400).setExpirationTime(now + 365 * 86400 + 600)),
      yearLong: await forge(u, (j) => j.setIssuedAt(now).setExpirationTime(now + 365 * 86400)),
      otherTyp: await forge(u, (j) => j.setIssuedAt(now).setExpirationTime(now + 600), 'JWT'),
      noAuthTime: await forge(u, (j) => j.setIssuedAt(now).setExpirationTime(now + 600), undefined, {}),
      signedInAfterIssue: await forge(u, (j) => j.setIssuedAt(now).setExpirationTime(now + 600), undefined, { auth_time: now + 120 }),
      noSub: await new SignJWT({ role: 'user', tv: 0 })
        .setProtectedHeader({ alg: 'HS256', typ: 'kms-session+jwt' })
        .setIssuer('kms')
        .setAudience('kms-api')
        .setIssuedAt(now)
        .setExpirationTime(now + 600)
        .sign(secret()),
    };
    for (const [name, token] of Object.entries(bad)) expect((await s.api('GET', '/auth/me', { token })).status, name).toBe(401);
    // A little clock skew is fine; more is not.
    const ahead = await forge(u, (j) => j.setIssuedAt(now + 60).setExpirationTime(now + 660));
    expect((await s.api('GET', '/auth/me', { token: ahead })).status).toBe(401);
    const skewed = await forge(u, (j) => j.setIssuedAt(now + 10).setExpirationTime(now + 610));
    expect((await s.api('GET', '/auth/me', { token: skewed })).status).toBe(200);
  });

  it('POST /auth/logout ends every session of the account', async () => {
    const u = await registerUser(s.api);
    const other = (await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } })).body.session.token;
    expect((await s.api('POST', '/auth/logout', { token: u.apiKey })).status).toBe(403);
    expect((await s.api('POST', '/auth/logout', { token: u.token })).status).toBe(200);
    for (const token of [u.token, other]) expect((await s.api('GET', '/auth/me', { token })).body.code).toBe('token_revoked');
  });
});

describe('credentials that could take over an account', () => {
  it('a partner API key cannot rotate itself; a session can', async () => {
    const u = await registerUser(s.api);
    const byKey = await s.api('POST', '/partners/rotate-api-key', { token: u.apiKey });
    expect(byKey.status).toBe(403);
    expect(byKey.body.code).toBe('session_required');
    expect((await s.api('GET', '/auth/me', { token: u.apiKey })).status).toBe(200);
    expect((await s.api('POST', '/partners/rotate-api-key', { token: u.token })).status).toBe(200);
  });

  it('new passwords have at least 12 characters (register, change, reset); existing shorter ones still log in', async () => {
    const res = await s.api('POST', '/partners/register', {
      body: { username: `short_${Date.now()}`, email: `short${Date.now()}@example.test`, password: 'elevenchars' },
    });
    expect(res.status).toBe(422);
    expect(res.body.errors[0].path).toBe('body.password');
    const u = await registerUser(s.api);
    const change = await s.api('POST', '/profile/change-password', { token: u.token, body: { current_password: u.password, new_password: 'elevenchars' } });
    expect(change.status).toBe(422);
    const reset = await s.api('POST', '/auth/reset-password', { body: { token: 'x'.repeat(43), new_password: 'elevenchars' } });
    expect(reset.status).toBe(422);
    // An account whose password predates the rule (10 characters then) keeps logging in with it.
    await s.c
      .db('users')
      .where({ id: u.id })
      .update({ password_hash: await hashPassword('tenchars10', s.config.argon2MemoryKib) });
    expect((await s.api('POST', '/auth/login', { body: { identifier: u.username, password: 'tenchars10' } })).status).toBe(200);
  });

  it('an email changes only when confirmed from the new address, with the current password; the old address is told', async () => {
    const u = await registerUser(s.api);
    const next = `moved${Date.now()}@example.test`;
    expect((await s.api('PUT', '/profile/update', { token: u.token, body: { email: next } })).status).toBe(422);
    expect((await s.api('PUT', '/profile/update', { token: u.token, body: { email: next, current_password: 'wrong password guess' } })).status).toBe(403);
    const asked = await s.api('PUT', '/profile/update', { token: u.token, body: { email: next, current_password: u.password } });
    expect(asked.status).toBe(200);
    expect(asked.body).toMatchObject({ email: u.email, pending_email: next });
    expect((await s.api('GET', '/auth/me', { token: u.token })).body.email).toBe(u.email);

    const mail = await smtp.waitFor(next);
    const token = /Confirmation token: (\S+)/.exec(mail.text ?? '')![1];
    expect((await s.api('POST', '/profile/confirm-email', { body: { token: 'not-a-token' } })).status).toBe(400);
    const confirmed = await s.api('POST', '/profile/confirm-email', { body: { token } });
    expect(confirmed.status).toBe(200);
    expect(confirmed.body).toMatchObject({ email: next, email_verified: true });
    expect((await s.api('POST', '/profile/confirm-email', { body: { token } })).status).toBe(410);
    const notice = await smtp.waitFor(u.email);
    expect(notice.text).toContain(next);
  });

  it('ADMIN_EMAILS promotes only a verified email: not at registration, yes after a password reset proves the mailbox', async () => {
    const u = await registerUser(s.api, { email: 'chief@example.test' });
    expect((await s.api('GET', '/auth/me', { token: u.token })).body).toMatchObject({ role: 'user', email_verified: false });
    expect((await s.api('POST', '/auth/forgot-password', { body: { email: u.email } })).status).toBe(202);
    const mail = await smtp.waitFor(u.email);
    const token = /Reset token: (\S+)/.exec(mail.text ?? '')![1];
    expect((await s.api('POST', '/auth/reset-password', { body: { token, new_password: 'the chief new password' } })).status).toBe(200);
    const login = await s.api('POST', '/auth/login', { body: { identifier: u.username, password: 'the chief new password' } });
    expect(login.body.user).toMatchObject({ role: 'admin', email_verified: true });
    // The reset also retired the partner key issued under the old password.
    expect((await s.api('GET', '/auth/me', { token: u.apiKey })).status).toBe(401);
  });

  it('forgot-password does the same work for known and unknown addresses: one sealed job each, nothing else on the request path', async () => {
    const u = await registerUser(s.api);
    const queue = s.c.jobs.queue('notify');
    const add = queue.add.bind(queue);
    const added: { name: string; data: unknown }[] = [];
    queue.add = (async (name: string, data: unknown, opts?: object) => {
      added.push({ name, data });
      return add(name, data, opts);
    }) as typeof queue.add;
    try {
      for (const email of [u.email, `nobody${Date.now()}@example.test`]) {
        expect((await s.api('POST', '/auth/forgot-password', { body: { email } })).status).toBe(202);
      }
    } finally {
      queue.add = add;
    }
    // The in-process worker may enqueue the known account's email meanwhile; the request path adds one
    // sealed job per request, known address or not, and nothing else.
    expect(added.filter((a) => a.name === 'request-password-reset')).toHaveLength(2);
    expect(added.filter((a) => a.name !== 'request-password-reset').every((a) => a.name === 'send-email')).toBe(true);
    expect(JSON.stringify(added)).not.toContain(u.email);
    await smtp.waitFor(u.email);
  });
});

/** The rows of an account's audit chain, in order. */
const chainOf = (userId: string) => s.c.db('audit_logs').where({ chain: userId }).orderBy('sequence');

describe('refusals an outsider can repeat', () => {
  it('1,000 refused logins on a locked account, each with a forged X-Request-Id, add one audit row; the lock ending adds one summary', async () => {
    const u = await registerUser(s.api);
    for (let i = 0; i < 5; i++)
      expect((await s.api('POST', '/auth/login', { body: { identifier: u.username, password: 'wrong password guess' } })).status).toBe(401);
    const before = (await chainOf(u.id)).length;
    const refused: number[] = [];
    for (let i = 0; i < 1000; i += 25) {
      const batch = await Promise.all(
        Array.from({ length: 25 }, (_, j) =>
          s.api('POST', '/auth/login', {
            headers: { 'x-request-id': `FORGED-${i + j}` },
            body: { identifier: j % 2 ? u.email : u.username, password: 'wrong password guess' },
          }),
        ),
      );
      refused.push(...batch.map((r) => r.status));
    }
    expect(statuses(refused.map((status) => ({ status })))).toEqual({ 429: 1000 });
    const during = (await chainOf(u.id)).slice(before);
    expect(during).toHaveLength(1);
    expect(during[0]).toMatchObject({ action: 'sessions.login', status: 'failure', details: { reason: 'locked' } });
    expect(during[0].client_request_id).toMatch(/^FORGED-\d+$/);

    // The lock ends (as its expiry does), and the next login is the event that closes the episode.
    await s.c.limiters.loginAccount.delete(`user:${u.id}`);
    const ok = await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } });
    expect(ok.status).toBe(200);
    const after = (await chainOf(u.id)).slice(before);
    expect(after.map((r) => [r.action, r.status, r.details.reason ?? null])).toEqual([
      ['sessions.login', 'failure', 'locked'],
      ['sessions.login', 'failure', 'locked'],
      ['sessions.login', 'success', null],
    ]);
    expect(after[1].details).toMatchObject({ refused: 1000, first_refused_at: expect.any(String), last_refused_at: expect.any(String) });
    expect(after[1].request_id).toBe(ok.headers.get('x-request-id'));
    const verdict = await s.api('GET', '/audit-logs/verify', { token: ok.body.session.token });
    expect(verdict.body).toMatchObject({ ok: true });
  });

  it("refusals of a blocked client address count on the account they name; the owner's next login ends the episode", async () => {
    const p = behindProxy;
    const u = await registerUser(p.api);
    const from = (client: string) => (password: string) =>
      p.api('POST', '/auth/login', { headers: { 'x-forwarded-for': `203.0.113.1, ${client}` }, body: { identifier: u.username, password } });
    const attacker = from('192.0.2.99');
    const answers = [];
    for (let i = 0; i < 40; i++) answers.push(await attacker('wrong password guess'));
    // LOGIN_IP_MAX_FAILURES=3 there: three checks, then the address is refused before the account's budget is touched.
    expect(statuses(answers)).toEqual({ 401: 3, 429: 37 });
    const rows = () => p.c.db('audit_logs').where({ chain: u.id, action: 'sessions.login' }).orderBy('sequence');
    expect((await rows()).map((r) => r.details.reason)).toEqual(['wrong_password', 'wrong_password', 'wrong_password', 'locked']);
    expect((await from('192.0.2.100')(u.password)).status).toBe(200);
    const after = await rows();
    expect(after.map((r) => r.details.reason ?? r.status)).toEqual(['wrong_password', 'wrong_password', 'wrong_password', 'locked', 'locked', 'success']);
    expect(after[4].details).toMatchObject({ refused: 37 });
    expect(after[4].ip).toBe('192.0.2.100');
  });
  it("a session token kept after the owner signed out everywhere, replayed 300 times, adds one row; the owner's next sign-in adds the summary", async () => {
    const u = await registerUser(s.api);
    const stolen = (await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } })).body.session.token as string;
    expect((await s.api('POST', '/auth/logout', { token: u.token })).status).toBe(200);
    const before = (await chainOf(u.id)).length;
    const answers = [];
    for (let i = 0; i < 300; i += 25) answers.push(...(await Promise.all(Array.from({ length: 25 }, () => s.api('GET', '/keys/list', { token: stolen })))));
    expect(statuses(answers)).toEqual({ 401: 300 });
    const during = (await chainOf(u.id)).slice(before);
    expect(during.map((r) => [r.action, r.details.reason])).toEqual([['sessions.deny', 'token_revoked']]);

    expect((await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } })).status).toBe(200);
    const after = (await chainOf(u.id)).slice(before);
    expect(after.map((r) => [r.action, r.details.reason ?? r.status])).toEqual([
      ['sessions.deny', 'token_revoked'],
      ['sessions.deny', 'token_revoked'],
      ['sessions.login', 'success'],
    ]);
    expect(after[1].details).toMatchObject({ refused: 300 });
  });
});

describe('request ids', () => {
  it("are always the service's own; a client's X-Request-Id is kept as client_request_id only when short and plain", async () => {
    const logs = captureLogs();
    const original = s.c.log;
    s.c.log = logs.logger('info');
    const u = await registerUser(s.api);
    const forged = ['FORGED with spaces', `FORGED-${'x'.repeat(60)}`, 'FORGED<script>', 'FORGED/../etc', 'FORGED;drop', 'FORGED%20pct', 'FORGED+plus'];
    const good = 'client-req:42.a_B';
    try {
      for (const [i, id] of [...forged, good].entries()) {
        // A failed login (a problem body) and a successful one, each audited.
        const password = i % 2 ? u.password : 'wrong password guess';
        const res = await s.api('POST', '/auth/login', { headers: { 'x-request-id': id }, body: { identifier: u.username, password } });
        expect(res.status).toBe(i % 2 ? 200 : 401);
        const ours = res.headers.get('x-request-id')!;
        expect(ours).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
        if (res.status === 401) expect(res.body.request_id).toBe(ours);
        expect(res.headers.get('x-client-request-id')).toBe(id === good ? good : null);
        const row = await s.c.db('audit_logs').where({ request_id: ours }).first();
        expect(row).toMatchObject({ user_id: u.id, action: 'sessions.login', client_request_id: id === good ? good : null });
      }
    } finally {
      s.c.log = original;
    }
    const rows = JSON.stringify(await s.c.db('audit_logs').select('request_id', 'client_request_id', 'details', 'target'));
    const text = logs.output();
    for (const id of forged) {
      expect(rows).not.toContain(id);
      expect(text).not.toContain(id);
    }
    expect(text).toContain(`"client_request_id":"${good}"`);
    expect(rows).toContain(good);
  });
});
