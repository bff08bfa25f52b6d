import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { routes } from '../../api/app';

let s: TestService;
beforeAll(async () => {
  s = await startTestService();
});
afterAll(async () => {
  await s?.stop();
});

describe('registration and login', () => {
  it('registers a partner and logs in by username and by email', async () => {
    const u = await registerUser(s.api);
    expect(u.apiKey).toMatch(/^kms_pk_[A-Za-z0-9_-]{43}$/);
    for (const identifier of [u.username, u.email.toUpperCase()]) {
      const res = await s.api('POST', '/auth/login', { body: { identifier, password: u.password } });
      expect(res.status).toBe(200);
      expect(res.body.session.token_type).toBe('Bearer');
      expect(res.body.token).toBeUndefined();
      const me = await s.api('GET', '/auth/me', { token: res.body.session.token });
      expect(me.status).toBe(200);
      expect(me.body).toMatchObject({ user_id: u.id, username: u.username, role: 'user', authenticated_via: 'jwt' });
      expect(me.body.password_hash).toBeUndefined();
    }
  });

  it('answers 409 for a duplicate username or email', async () => {
    const u = await registerUser(s.api);
    const dupUser = await s.api('POST', '/partners/register', {
      body: { username: u.username.toUpperCase(), email: 'other@example.test', password: 'long enough pw' },
    });
    expect(dupUser.status).toBe(409);
    expect(dupUser.body.code).toBe('username_taken');
    const dupEmail = await s.api('POST', '/partners/register', { body: { username: 'someone_else_x', email: u.email, password: 'long enough pw' } });
    expect(dupEmail.status).toBe(409);
    expect(dupEmail.body.code).toBe('email_taken');
  });

  it('rejects a wrong password and an unknown user alike, and audits the failure', async () => {
    const u = await registerUser(s.api);
    const wrong = await s.api('POST', '/auth/login', { body: { identifier: u.username, password: 'not the password' } });
    const unknown = await s.api('POST', '/auth/login', { body: { identifier: 'nobody_here', password: 'not the password' } });
    expect(wrong.status).toBe(401);
    expect(unknown.status).toBe(401);
    expect(wrong.body.code).toBe(unknown.body.code);
    expect(wrong.headers.get('content-type')).toContain('application/problem+json');
    const log = await s.api('GET', '/audit-logs?action=sessions.login&status=failure', { token: u.token });
    expect(log.body.items[0]).toMatchObject({ action: 'sessions.login', status: 'failure', details: { reason: 'wrong_password' } });
    expect(JSON.stringify(log.body)).not.toContain('not the password');
  });

  it('validates bodies with 422 problem details and never 500', async () => {
    const bad = await s.api('POST', '/partners/register', { body: { username: 'a', email: 'nope', password: 'short' } });
    expect(bad.status).toBe(422);
    expect(bad.body.code).toBe('validation_failed');
    expect(bad.body.errors.map((e: { path: string }) => e.path).sort()).toEqual(['body.email', 'body.password', 'body.username']);
    const malformed = await s.api('POST', '/auth/login', { raw: '{"identifier": ', headers: { 'content-type': 'application/json' } });
    expect(malformed.status).toBe(422);
    expect(malformed.body.code).toBe('malformed_body');
    const huge = await s.api('POST', '/auth/login', { body: { identifier: 'x', password: 'y'.repeat(400_000) } });
    expect(huge.status).toBe(413);
    expect(huge.body.code).toBe('payload_too_large');
    const array = await s.api('POST', '/auth/login', { body: [1, 2] });
    expect(array.status).toBe(422);
  });
});

describe('sessions and credentials', () => {
  it('needs credentials and rejects garbage tokens', async () => {
    expect((await s.api('GET', '/auth/me')).status).toBe(401);
    const res = await s.api('GET', '/auth/me', { token: 'not-a-jwt' });
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toContain('Bearer');
  });

  it('accepts the partner API key as a Bearer credential, but not for account credentials', async () => {
    const u = await registerUser(s.api);
    const me = await s.api('GET', '/auth/me', { token: u.apiKey });
    expect(me.status).toBe(200);
    expect(me.body.authenticated_via).toBe('partner_key');
    const change = await s.api('POST', '/profile/change-password', {
      token: u.apiKey,
      body: { current_password: u.password, new_password: 'a brand new password' },
    });
    expect(change.status).toBe(403);
    expect(change.body.code).toBe('session_required');
  });

  it('rotates the partner key: the new one works, the old one is dead', async () => {
    const u = await registerUser(s.api);
    const rotated = await s.api('POST', '/partners/rotate-api-key', { token: u.token });
    expect(rotated.status).toBe(200);
    expect(rotated.body.api_key).not.toBe(u.apiKey);
    expect((await s.api('GET', '/auth/me', { token: u.apiKey })).status).toBe(401);
    expect((await s.api('GET', '/auth/me', { token: rotated.body.api_key })).status).toBe(200);
    const status = await s.api('GET', '/partners/api-key-status', { token: u.token });
    expect(status.body).toMatchObject({ status: 'active', prefix: rotated.body.prefix });
    expect(status.body.days_remaining).toBe(90);
    const meta = await s.api('GET', '/profile/api-key', { token: u.token });
    expect(meta.body.prefix).toBe(rotated.body.prefix);
    expect(JSON.stringify(meta.body)).not.toContain(rotated.body.api_key);
  });

  it('keeps one active partner key under concurrent rotations', async () => {
    const u = await registerUser(s.api);
    const results = await Promise.all([1, 2, 3, 4].map(() => s.api('POST', '/partners/rotate-api-key', { token: u.token })));
    expect(results.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    const working = await Promise.all(results.map((r) => s.api('GET', '/auth/me', { token: r.body.api_key })));
    expect(working.filter((r) => r.status === 200)).toHaveLength(1);
  });

  it('expires the partner key after its lifetime', async () => {
    const u = await registerUser(s.api);
    const clock = s.c.clock as import('../support/service').ManualClockFollowingTime;
    clock.advance(91 * 86400_000);
    try {
      const res = await s.api('GET', '/auth/me', { token: u.apiKey });
      expect(res.status).toBe(401);
      expect(res.body.code).toBe('api_key_expired');
    } finally {
      clock.advance(-91 * 86400_000);
    }
  });
});

describe('lockout', () => {
  it('locks an account after repeated failures with 429 and Retry-After, even for the right password', async () => {
    const u = await registerUser(s.api);
    for (let i = 0; i < s.config.login.maxFailures; i++) {
      const r = await s.api('POST', '/auth/login', { body: { identifier: u.username, password: 'wrong password!' } });
      expect(r.status).toBe(401);
    }
    const locked = await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } });
    expect(locked.status).toBe(429);
    expect(Number(locked.headers.get('retry-after'))).toBeGreaterThan(0);
    expect(locked.body.code).toBe('rate_limited');
  });
});

describe('http conventions', () => {
  it('answers unknown routes with 404 and wrong methods with 405 and Allow', async () => {
    const missing = await s.api('GET', '/no/such/route');
    expect(missing.status).toBe(404);
    expect(missing.body.code).toBe('route_not_found');
    const wrong = await s.api('DELETE', '/auth/login');
    expect(wrong.status).toBe(405);
    expect(wrong.headers.get('allow')).toContain('POST');
    expect(wrong.body.code).toBe('method_not_allowed');
  });

  it("answers its own request id, whatever X-Request-Id the client sends (test/accounts/auth-limits.test.ts: where the client's goes)", async () => {
    for (const sent of ['abc-123', 'bad id with spaces', undefined]) {
      const res = await s.api('GET', '/health', { headers: sent ? { 'x-request-id': sent } : {} });
      expect(res.headers.get('x-request-id')).toMatch(/^[0-9a-f-]{36}$/);
    }
  });

  it('serves an OpenAPI document describing every route', async () => {
    const res = await s.api('GET', '/openapi.json');
    expect(res.status).toBe(200);
    expect(res.body.openapi).toBe('3.1.0');
    for (const r of routes) expect(res.body.paths[r.path]?.[r.method], `${r.method} ${r.path}`).toBeDefined();
    expect(res.body.paths['/keys/encrypt'].post.requestBody.content['multipart/form-data']).toBeDefined();
  });

  it('reports health of Postgres and Redis', async () => {
    const res = await s.api('GET', '/health');
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ status: 'ok', checks: { postgres: 'up', redis: 'up' } });
  });
});
