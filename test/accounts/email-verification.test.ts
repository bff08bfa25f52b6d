import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { startSmtpServer } from '../support/smtp';

/**
 * Registration mails a confirmation of the account's address; redeeming it marks the address verified
 * and changes nothing else; Profile can ask for it again until the address is confirmed.
 */
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

/** The confirmation mailed to `to`, taken out of the inbox, and the token it carries. */
async function confirmationTo(to: string): Promise<string> {
  const mail = await smtp.waitFor(to, { confirmation: true });
  smtp.confirmations.splice(smtp.confirmations.indexOf(mail), 1);
  expect(mail.text).toContain(`/confirm-email#token=`);
  return /Confirmation token: (\S+)/.exec(mail.text ?? '')![1];
}

const me = async (token: string) => (await s.api('GET', '/auth/me', { token })).body;

describe('email verification', () => {
  it('registration mails a token that verifies the address, once, and tells no one of a change', async () => {
    const u = await registerUser(s.api);
    expect((await me(u.token)).email_verified).toBe(false);
    const token = await confirmationTo(u.email);

    const confirmed = await s.api('POST', '/profile/confirm-email', { body: { token } });
    expect(confirmed.status, JSON.stringify(confirmed.body)).toBe(200);
    expect(confirmed.body).toMatchObject({ email: u.email, email_verified: true });
    expect((await me(u.token)).email_verified).toBe(true);
    const again = await s.api('POST', '/profile/confirm-email', { body: { token } });
    expect([again.status, again.body.code]).toEqual([410, 'email_token_used']);
    // No "your email changed" notice: nothing changed.
    expect(smtp.received.some((m) => JSON.stringify(m.to).includes(u.email))).toBe(false);
    const audited = await s.c.db('audit_logs').where({ user_id: u.id, action: 'profiles.verify_email', status: 'success' });
    expect(audited.map((r: { details: { stage: string } }) => r.details.stage)).toEqual(['confirmed']);
  });

  it('confirming the address leaves a pending change to another address pending', async () => {
    const u = await registerUser(s.api);
    const verify = await confirmationTo(u.email);
    const next = `moved-${Date.now()}@example.test`;
    expect((await s.api('PUT', '/profile/update', { token: u.token, body: { email: next, current_password: u.password } })).status).toBe(200);
    const change = /Confirmation token: (\S+)/.exec((await smtp.waitFor(next)).text ?? '')![1];

    expect((await s.api('POST', '/profile/confirm-email', { body: { token: verify } })).body).toMatchObject({ email: u.email, email_verified: true });
    const moved = await s.api('POST', '/profile/confirm-email', { body: { token: change } });
    expect(moved.body).toMatchObject({ email: next, email_verified: true });
  });

  it('a confirmation of the old address does not outlive a change: it cannot move the email back', async () => {
    const u = await registerUser(s.api);
    const verify = await confirmationTo(u.email);
    const next = `away-${Date.now()}@example.test`;
    await s.api('PUT', '/profile/update', { token: u.token, body: { email: next, current_password: u.password } });
    const change = /Confirmation token: (\S+)/.exec((await smtp.waitFor(next)).text ?? '')![1];
    expect((await s.api('POST', '/profile/confirm-email', { body: { token: change } })).status).toBe(200);

    const stale = await s.api('POST', '/profile/confirm-email', { body: { token: verify } });
    expect([stale.status, stale.body.code]).toEqual([410, 'email_token_used']);
    expect((await me(u.token)).email).toBe(next);
  });

  it('resend mails a new token until the address is confirmed (409 after), within a budget spent first', async () => {
    const u = await registerUser(s.api);
    await confirmationTo(u.email);
    const sent = await s.api('POST', '/profile/confirm-email/resend', { token: u.token, body: {} });
    expect([sent.status, sent.body]).toEqual([202, { email: u.email }]);
    const token = await confirmationTo(u.email);
    expect((await s.api('POST', '/profile/confirm-email', { body: { token } })).status).toBe(200);

    const done = await s.api('POST', '/profile/confirm-email/resend', { token: u.token, body: {} });
    expect([done.status, done.body.code]).toEqual([409, 'email_already_verified']);
    // The budget is spent before that check: a verified account runs out as fast as an unverified one.
    let last = done;
    for (let i = 0; i < 30 && last.status !== 429; i++) last = await s.api('POST', '/profile/confirm-email/resend', { token: u.token, body: {} });
    expect(last.status).toBe(429);
    expect(Number(last.headers.get('retry-after'))).toBeGreaterThan(0);

    expect((await s.api('POST', '/profile/confirm-email/resend', { body: {} })).status).toBe(401);
    expect((await s.api('POST', '/profile/confirm-email/resend', { token: u.token, body: { email: 'x@example.test' } })).status).toBe(422);
  });
});
