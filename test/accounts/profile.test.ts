import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { registerUser, startTestService, type TestService } from '../support/service';

let s: TestService;
beforeAll(async () => {
  s = await startTestService({ env: { ADMIN_EMAILS: 'boss@example.test' } });
});
afterAll(async () => {
  await s?.stop();
});

describe('profile', () => {
  it('updates username, email and company, with 409 on a taken name and 422 on nothing to change', async () => {
    const u = await registerUser(s.api);
    const other = await registerUser(s.api);
    const res = await s.api('PUT', '/profile/update', { token: u.token, body: { username: `${u.username}_x`, company_name: 'New Co' } });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ username: `${u.username}_x`, company_name: 'New Co', email: u.email });
    const taken = await s.api('PUT', '/profile/update', { token: u.token, body: { email: other.email, current_password: u.password } });
    expect(taken.status).toBe(409);
    expect(taken.body.code).toBe('email_taken');
    expect((await s.api('PUT', '/profile/update', { token: u.token, body: {} })).status).toBe(422);
    expect((await s.api('PUT', '/profile/update', { token: u.token, body: { role: 'admin' } })).status).toBe(422);
    expect((await s.api('GET', '/auth/me', { token: u.token })).body.role).toBe('user');
  });

  it('changes the password: old tokens die, a fresh one is returned, a wrong current password is refused', async () => {
    const u = await registerUser(s.api);
    const wrong = await s.api('POST', '/profile/change-password', {
      token: u.token,
      body: { current_password: 'not it at all', new_password: 'another long password' },
    });
    expect(wrong.status).toBe(403);
    expect(wrong.body.code).toBe('wrong_password');
    const same = await s.api('POST', '/profile/change-password', { token: u.token, body: { current_password: u.password, new_password: u.password } });
    expect(same.status).toBe(422);
    const ok = await s.api('POST', '/profile/change-password', {
      token: u.token,
      body: { current_password: u.password, new_password: 'another long password' },
    });
    expect(ok.status).toBe(200);
    const old = await s.api('GET', '/auth/me', { token: u.token });
    expect(old.status).toBe(401);
    expect(old.body.code).toBe('token_revoked');
    expect((await s.api('GET', '/auth/me', { token: ok.body.session.token })).status).toBe(200);
    // the partner key does not outlive the password it was issued under
    expect((await s.api('GET', '/auth/me', { token: u.apiKey })).status).toBe(401);
    const revoked = await s.c.db('audit_logs').where({ user_id: u.id, action: 'passwords.change', status: 'success' }).first();
    // The one outstanding confirmation is registration's, of the address the account has.
    expect(revoked.details).toEqual({ partner_keys_revoked: 1, email_changes_voided: 1 });
  });

  it('stores the rotation policy within bounds', async () => {
    const u = await registerUser(s.api);
    const ok = await s.api('POST', '/profile/update-rotation-days', { token: u.token, body: { rotation_interval_days: 30 } });
    expect(ok.body).toEqual({ rotation_interval_days: 30 });
    expect((await s.api('GET', '/auth/me', { token: u.token })).body.rotation_interval_days).toBe(30);
    for (const rotation_interval_days of [0, 731, 1.5, '30']) {
      const bad = await s.api('POST', '/profile/update-rotation-days', { token: u.token, body: { rotation_interval_days } });
      expect(bad.status).toBe(422);
    }
    const off = await s.api('POST', '/profile/update-rotation-days', { token: u.token, body: { rotation_interval_days: null } });
    expect(off.body).toEqual({ rotation_interval_days: null });
  });

  it('shows recent activity from the audit log, own rows only', async () => {
    const u = await registerUser(s.api);
    const other = await registerUser(s.api);
    await s.api('POST', '/profile/update-rotation-days', { token: u.token, body: { rotation_interval_days: 7 } });
    const res = await s.api('GET', '/profile/recent-activity?page_size=5', { token: u.token });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ page: 1, page_size: 5, total: 2 });
    expect(res.body.items.map((i: { action: string }) => i.action)).toEqual(['profiles.update_rotation_days', 'partners.register']);
    const theirs = await s.api('GET', '/profile/recent-activity', { token: other.token });
    expect(theirs.body.items.map((i: { action: string }) => i.action)).toEqual(['partners.register']);
  });

  it('deletes an account: sessions and keys die, the name is free again, audit rows stay', async () => {
    const u = await registerUser(s.api);
    const wrong = await s.api('POST', '/profile/delete-account', { token: u.token, body: { password: 'not it at all' } });
    expect(wrong.status).toBe(403);
    const res = await s.api('POST', '/profile/delete-account', { token: u.token, body: { password: u.password } });
    expect(res.status).toBe(200);
    expect((await s.api('GET', '/auth/me', { token: u.token })).status).toBe(401);
    expect((await s.api('GET', '/auth/me', { token: u.apiKey })).status).toBe(401);
    expect((await s.api('POST', '/auth/login', { body: { identifier: u.email, password: u.password } })).status).toBe(401);
    await registerUser(s.api, { username: u.username, email: u.email });
    const audit = await s.c.db('audit_logs').where({ user_id: u.id, action: 'accounts.delete', status: 'success' });
    expect(audit).toHaveLength(1);
  });

  it('refuses to delete an administrator account', async () => {
    const admin = await registerUser(s.api, { email: 'boss@example.test' });
    await s.c.db('users').where({ id: admin.id }).update({ role: 'admin' }); // as `npm run admin -- grant` does
    const me = await s.api('GET', '/auth/me', { token: admin.token });
    expect(me.body.role).toBe('admin');
    const res = await s.api('POST', '/profile/delete-account', { token: admin.token, body: { password: admin.password } });
    expect(res.status).toBe(403);
    expect(res.body.code).toBe('admin_account_protected');
  });
});

describe('audit log', () => {
  it('pages and filters by action (also by prefix) and status, newest first', async () => {
    const u = await registerUser(s.api);
    for (let i = 0; i < 3; i++) await s.api('POST', '/auth/login', { body: { identifier: u.username, password: 'wrong password!' } });
    await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } });
    const all = await s.api('GET', '/audit-logs?page_size=2', { token: u.token });
    expect(all.body).toMatchObject({ page: 1, page_size: 2, total: 5 });
    expect(all.body.items).toHaveLength(2);
    const page3 = await s.api('GET', '/audit-logs?page_size=2&page=3', { token: u.token });
    expect(page3.body.items.map((i: { action: string }) => i.action)).toEqual(['partners.register']);
    const failures = await s.api('GET', '/audit-logs?action=sessions.login&status=failure', { token: u.token });
    expect(failures.body.total).toBe(3);
    const prefix = await s.api('GET', '/audit-logs?action=auth.*', { token: u.token });
    expect(prefix.body.total).toBe(4);
    expect((await s.api('GET', '/audit-logs?page_size=500', { token: u.token })).status).toBe(422);
    expect((await s.api('GET', '/audit-logs?status=maybe', { token: u.token })).status).toBe(422);
    expect((await s.api('GET', "/audit-logs?action=x'or'1", { token: u.token })).status).toBe(422);
  });
});

describe('contact', () => {
  it('stores the request and forwards it to support through the notify queue', async () => {
    const res = await s.api('POST', '/auth/contact', { body: { name: 'Ann', email: 'ann@example.test', subject: 'Hello', message: 'I need help with keys.' } });
    expect(res.status).toBe(202);
    expect(res.body.reference).toMatch(/^[0-9a-f-]{36}$/);
    expect(await s.c.db('contact_requests').where({ id: res.body.reference }).first()).toMatchObject({ email: 'ann@example.test' });
    const bad = await s.api('POST', '/auth/contact', { body: { name: '', email: 'ann@example.test', subject: 'Hello', message: 'x' } });
    expect(bad.status).toBe(422);
  });
});

describe('admin command', () => {
  it('grants and revokes the admin role from the command line, never through the API', async () => {
    const u = await registerUser(s.api);
    const run = promisify(execFile);
    await run('npx', ['tsx', 'db/cli/admin.ts', 'grant', u.username], { env: { ...process.env, ...s.env } });
    expect((await s.api('GET', '/auth/me', { token: u.token })).body.role).toBe('admin');
    await run('npx', ['tsx', 'db/cli/admin.ts', 'revoke', u.email], { env: { ...process.env, ...s.env } });
    expect((await s.api('GET', '/auth/me', { token: u.token })).body.role).toBe('user');
    const registerAsAdmin = await s.api('POST', '/partners/register', {
      body: { username: 'sneaky_one', email: 'sneaky@example.test', password: 'long enough pw', role: 'admin' },
    });
    // `role` is not a field of registration: refused like any field a route does not name.
    expect([registerAsAdmin.status, registerAsAdmin.body.errors]).toEqual([422, [{ path: 'body.role', message: 'is not a field of this request' }]]);
    expect(await s.c.db('users').where({ username: 'sneaky_one' }).first()).toBeUndefined();
  });
});
