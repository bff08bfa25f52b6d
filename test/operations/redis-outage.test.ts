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

/** A request's answer and how long it took; the signal only guards against a hang (timing is printed, not asserted). */
async function timed(path: string, init: RequestInit & { token?: string; json?: unknown }) {
  const headers = new Headers(init.headers);
  if (init.token) headers.set('authorization', `Bearer ${init.token}`);
  if (init.json !== undefined) headers.set('content-type', 'application/json');
  const started = Date.now();
  const res = await fetch(`${s.url}${path}`, {
    ...init,
    headers,
    body: init.json !== undefined ? JSON.stringify(init.json) : init.body,
    signal: AbortSignal.timeout(15_000),
  });
  const body = (await res.json()) as { code?: string; job_id?: string; status_url?: string };
  return { status: res.status, body, retryAfter: res.headers.get('retry-after'), ms: Date.now() - started };
}

describe('a frozen Redis', () => {
  it('answers requests that need it 503 with the code of what failed, and the limits it could not count are not spent', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const ms: Record<string, number[]> = {};
    const note = (what: string, t: { ms: number }) => (ms[what] ??= []).push(t.ms);
    redis.freeze();
    try {
      const logins = await Promise.all(
        Array.from({ length: 8 }, () => timed('/auth/login', { method: 'POST', json: { identifier: u.username, password: u.password } })),
      );
      for (const t of logins) {
        expect(t).toMatchObject({ status: 503, body: { code: 'rate_limiter_unavailable' }, retryAfter: '5' });
        note('login', t);
      }
      // A file job's submission follows its job's events first: that read is what fails.
      const form = new FormData();
      form.append('fingerprint', key.fingerprint);
      form.append('files', new Blob([Buffer.from('hello')]), 'a.txt');
      const encrypt = await timed('/keys/encrypt', { method: 'POST', token: u.token, body: form });
      expect(encrypt).toMatchObject({ status: 503, body: { code: 'redis_unavailable' }, retryAfter: '5' });
      expect(encrypt.body.job_id).toBeUndefined();
      note('encrypt', encrypt);
      // A rotation records its job, then cannot queue it. The second one's failed job is published to an
      // account whose event relay is still waiting on Redis for the first one's: one wait in all, still.
      for (const n of [1, 2]) {
        const rotate = await timed(`/keys/${key.fingerprint}/rotate`, {
          method: 'POST',
          token: u.token,
          json: {},
          headers: { 'idempotency-key': `rotate-${n}` },
        });
        expect(rotate).toMatchObject({ status: 503, body: { code: 'queue_unavailable' }, retryAfter: '5' });
        expect(rotate.body.status_url).toBe(`/api/v1/jobs/${rotate.body.job_id}`);
        note('rotate', rotate);
        // The job the answer names has failed with that code: the client knows it did not happen.
        const job = await s.api('GET', `/jobs/${rotate.body.job_id}`, { token: u.token });
        expect([job.status, job.body.state, job.body.error?.code]).toEqual([200, 'failed', 'queue_unavailable']);
      }
    } finally {
      redis.thaw();
    }
    console.log(
      `frozen Redis, ms to each 503: ${Object.entries(ms)
        .map(([what, list]) => `${what} ${list.join(', ')}`)
        .join('; ')}`,
    );
    // The logins that Redis counted only once it resumed were given back: the right password signs in.
    const res = await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    // The refused rotation freed its Idempotency-Key, and its queue, first used while Redis was frozen, takes jobs.
    const again = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers: { 'idempotency-key': 'rotate-1' } });
    expect(again.status, JSON.stringify(again.body)).toBe(202);
  });
});

describe('a Redis that is down', () => {
  it('refuses a job 503 `queue_unavailable` before recording it', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    await redis.stop();
    try {
      const rotate = await timed(`/keys/${key.fingerprint}/rotate`, { method: 'POST', token: u.token, json: {} });
      expect(rotate).toMatchObject({ status: 503, body: { code: 'queue_unavailable' }, retryAfter: '5' });
      expect(rotate.body.job_id).toBeUndefined();
    } finally {
      await redis.start();
    }
    await expect.poll(() => s.c.redis.status, { timeout: 10_000 }).toBe('ready');
    const rotate = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {} });
    expect(rotate.status, JSON.stringify(rotate.body)).toBe(202);
  });
});
