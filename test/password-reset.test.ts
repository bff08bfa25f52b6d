import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService, type ManualClockFollowingTime } from './support/service';
import { startSmtpServer } from './support/smtp';

let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;

beforeAll(async () => {
  smtp = await startSmtpServer();
  s = await startTestService({ env: { SMTP_URL: smtp.url } });
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

const tokenFrom = (text: string) => /Reset token: (\S+)/.exec(text)?.[1];

async function requestReset(email: string) {
  const res = await s.api('POST', '/auth/forgot-password', { body: { email } });
  expect(res.status).toBe(202);
  const mail = await smtp.waitFor(email);
  smtp.received.splice(smtp.received.indexOf(mail), 1);
  return tokenFrom(mail.text ?? '')!;
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
    const results = await Promise.all(['first new password', 'second new password'].map((new_password) => s.api('POST', '/auth/reset-password', { body: { token, new_password } })));
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
});
