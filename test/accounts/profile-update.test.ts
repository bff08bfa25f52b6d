import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, withClockAhead, type ManualClockFollowingTime, type TestService } from '../support/service';

/**
 * A client that sends the whole profile form back (username, email, company) changes only what differs:
 * the address the account already has, in any case or spacing, is no email change, so it needs neither
 * the current password nor a recent sign-in, and mails no confirmation.
 */
let s: TestService;
beforeAll(async () => {
  s = await startTestService();
});
afterAll(async () => {
  await s?.stop();
});

describe('PUT /profile/update with the unchanged email', () => {
  it('is not an email change: no current_password, no recent sign-in, nothing pending', async () => {
    const u = await registerUser(s.api);
    const clock = s.c.clock as ManualClockFollowingTime;
    const res = await withClockAhead(clock, s.config.recentSignInSeconds * 1000 + 60_000, () =>
      s.api('PUT', '/profile/update', { token: u.token, body: { email: `  ${u.email.toUpperCase()} `, company_name: 'Renamed Co' } }),
    );
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ email: u.email, company_name: 'Renamed Co', pending_email: null });
    // Only the confirmation registration mailed.
    expect(await s.c.db('email_changes').where({ user_id: u.id })).toHaveLength(1);

    const alone = await s.api('PUT', '/profile/update', { token: u.token, body: { email: u.email } });
    expect(alone.status).toBe(200);
    expect(alone.body).toMatchObject({ email: u.email, pending_email: null });
  });

  it('still asks for the current password when the email does change', async () => {
    const u = await registerUser(s.api);
    const res = await s.api('PUT', '/profile/update', { token: u.token, body: { email: `other-${u.email}` } });
    expect(res.status).toBe(422);
    expect(res.body.errors).toEqual([{ path: 'body.current_password', message: 'required to change the email' }]);
  });
});
