import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { startRedisServer } from '../support/redis-server';
import { createKey } from '../support/keys';

let redis: Awaited<ReturnType<typeof startRedisServer>>;
let s: TestService;

beforeAll(async () => {
  redis = await startRedisServer();
  // A small budget per address, so that logins Redis counted after the freeze would use it up.
  s = await startTestService({ roles: ['web'], env: { REDIS_URL: redis.url, LOGIN_IP_MAX_FAILURES: '5' } });
});
afterAll(async () => {
  redis?.thaw();
  await s?.stop();
  await redis?.stop();
});

describe('a frozen Redis', () => {
  it('answers requests that need it 503 within a few seconds, and the limits it could not count are not spent', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    redis.freeze();
    try {
      const tries = await Promise.all(
        Array.from({ length: 8 }, async () => {
          const started = Date.now();
          const res = await fetch(`${s.url}/auth/login`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ identifier: u.username, password: u.password }),
            signal: AbortSignal.timeout(10_000),
          });
          const body = (await res.json()) as { code?: string };
          return { status: res.status, code: body.code, ms: Date.now() - started, retryAfter: res.headers.get('retry-after') };
        }),
      );
      for (const t of tries) {
        expect(t).toMatchObject({ status: 503, code: 'rate_limiter_unavailable' });
        expect(t.retryAfter).toMatch(/^\d+$/);
        expect(t.ms).toBeLessThan(5_000);
      }
      // A job's submission: its row is written, then it cannot be queued.
      const started = Date.now();
      const job = await s.api('POST', '/keys/encrypt', {
        token: u.token,
        form: { fingerprint: key.fingerprint, files: [{ name: 'a.txt', data: Buffer.from('hello') }] },
      });
      expect([job.status, job.body.code]).toEqual([503, 'redis_unavailable']);
      expect(Date.now() - started).toBeLessThan(5_000);
    } finally {
      redis.thaw();
    }
    // The logins that Redis counted only once it resumed were given back: the right password signs in.
    const res = await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
  });
});
