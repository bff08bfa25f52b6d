import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { startSmtpServer } from '../support/smtp';

/**
 * An email change is a credential change: it needs the current password and a confirmation from the
 * new mailbox, the old one is told, and it interacts with the other recovery paths (password change,
 * password reset, ADMIN_EMAILS) so that none of them lets a stolen session keep the account.
 */
let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;

beforeAll(async () => {
  smtp = await startSmtpServer();
  s = await startTestService({ env: { SMTP_URL: smtp.url, ADMIN_EMAILS: 'root@example.test' } });
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

let n = 0;
const fresh = (name: string) => `${name}${Date.now()}x${n++}@example.test`;

/** Waits for the next mail to `to`, takes it out of the inbox and returns the token it carries. */
async function tokenMailedTo(to: string, label: 'Confirmation token' | 'Reset token'): Promise<string> {
  const mail = await smtp.waitFor(to);
  smtp.received.splice(smtp.received.indexOf(mail), 1);
  return new RegExp(`${label}: (\\S+)`).exec(mail.text ?? '')![1];
}

async function askEmailChange(u: { token: string; password: string }, email: string) {
  const res = await s.api('PUT', '/profile/update', { token: u.token, body: { email, current_password: u.password } });
  expect(res.status).toBe(200);
  return tokenMailedTo(email, 'Confirmation token');
}

describe('email change', () => {
  it('stores only a hash of the 256-bit token, which expires', async () => {
    const u = await registerUser(s.api);
    const next = fresh('hashed');
    const token = await askEmailChange(u, next);
    expect(Buffer.from(token, 'base64url')).toHaveLength(32);
    const rows = await s.c.db('email_changes').where({ user_id: u.id, new_email: next });
    expect(rows).toHaveLength(1);
    expect(JSON.stringify(rows)).not.toContain(token);
    const audit = await s.c.db('audit_logs').where({ user_id: u.id }).select('details');
    expect(JSON.stringify(audit)).not.toContain(token);

    const clock = s.c.clock as ManualClockFollowingTime;
    clock.advance(61 * 60_000);
    try {
      const late = await s.api('POST', '/profile/confirm-email', { body: { token } });
      expect(late.status).toBe(410);
      expect(late.body.code).toBe('email_token_expired');
    } finally {
      clock.advance(-61 * 60_000);
    }
    expect((await s.api('GET', '/auth/me', { token: u.token })).body.email).toBe(u.email);
  });

  it('does not make an admin of an unconfirmed ADMIN_EMAILS address; the confirmation does, audited', async () => {
    const u = await registerUser(s.api);
    const token = await askEmailChange(u, 'root@example.test');
    const login = await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } });
    expect(login.body.user).toMatchObject({ role: 'user', email: u.email, email_verified: false });
    expect((await s.c.db('users').where({ id: u.id }).first()).role).toBe('user');

    const confirmed = await s.api('POST', '/profile/confirm-email', { body: { token } });
    expect(confirmed.status).toBe(200);
    expect(confirmed.body).toMatchObject({ email: 'root@example.test', email_verified: true, role: 'admin' });
    const promoted = await s.c.db('audit_logs').where({ user_id: u.id, action: 'users.promote', status: 'success' });
    expect(promoted).toHaveLength(1);
    expect(promoted[0].details).toEqual({ via: 'ADMIN_EMAILS' });
    const notice = await smtp.waitFor(u.email);
    expect(notice.subject).toMatch(/email address .* changed/);
  });

  it('a password change voids a pending email change (a stolen session cannot finish it later)', async () => {
    const u = await registerUser(s.api);
    const token = await askEmailChange(u, fresh('thief'));
    const changed = await s.api('POST', '/profile/change-password', {
      token: u.token,
      body: { current_password: u.password, new_password: 'the owner took it back' },
    });
    expect(changed.status).toBe(200);
    const late = await s.api('POST', '/profile/confirm-email', { body: { token } });
    expect(late.status).toBe(410);
    expect(late.body.code).toBe('email_token_used');
    expect((await s.api('GET', '/auth/me', { token: changed.body.session.token })).body.email).toBe(u.email);
    const failure = await s.c.db('audit_logs').where({ user_id: u.id, action: 'profiles.change_email', status: 'failure' }).first();
    expect(failure.details).toEqual({ stage: 'confirmation', reason: 'email_token_used' });
  });

  it('a password reset voids a pending email change too', async () => {
    const u = await registerUser(s.api);
    const token = await askEmailChange(u, fresh('thief'));
    expect((await s.api('POST', '/auth/forgot-password', { body: { email: u.email } })).status).toBe(202);
    const reset = await tokenMailedTo(u.email, 'Reset token');
    expect((await s.api('POST', '/auth/reset-password', { body: { token: reset, new_password: 'the owner took it back' } })).status).toBe(200);
    expect((await s.api('POST', '/profile/confirm-email', { body: { token } })).status).toBe(410);
  });

  it('a confirmed change voids reset tokens mailed to the old address', async () => {
    const u = await registerUser(s.api);
    expect((await s.api('POST', '/auth/forgot-password', { body: { email: u.email } })).status).toBe(202);
    const reset = await tokenMailedTo(u.email, 'Reset token');
    const next = fresh('moved');
    const token = await askEmailChange(u, next);
    expect((await s.api('POST', '/profile/confirm-email', { body: { token } })).status).toBe(200);
    const late = await s.api('POST', '/auth/reset-password', { body: { token: reset, new_password: 'from the old mailbox' } });
    expect(late.status).toBe(410);
    expect(late.body.code).toBe('reset_token_used');
    expect((await s.api('POST', '/auth/login', { body: { identifier: next, password: u.password } })).status).toBe(200);
  });

  it('limits how many confirmation mails one account can send', async () => {
    const u = await registerUser(s.api);
    const answers = [];
    for (let i = 0; i < 31; i++) {
      answers.push((await s.api('PUT', '/profile/update', { token: u.token, body: { email: fresh('spam'), current_password: u.password } })).status);
    }
    expect(answers.slice(0, 30).every((status) => status === 200)).toBe(true);
    expect(answers[30]).toBe(429);
  });
});
