import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { randomUUID } from 'node:crypto';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createKey } from '../support/keys';
import { startProxy } from '../support/proxy';

let s: TestService;
let pgProxy: Awaited<ReturnType<typeof startProxy>>;
let redisProxy: Awaited<ReturnType<typeof startProxy>>;

beforeAll(async () => {
  const pg = new URL(inject('pgBase'));
  const redis = new URL(inject('redisUrl'));
  pgProxy = await startProxy(pg.hostname, Number(pg.port || 5432));
  redisProxy = await startProxy(redis.hostname, Number(redis.port || 6379));
  // The service reaches Postgres and Redis only through the proxies, which the tests can cut.
  // An upload's end is recorded again for 1 s (UPLOAD_END_RETRY_SECONDS) before it is answered 503.
  s = await startTestService({
    roles: ['web'],
    env: { REDIS_URL: `redis://127.0.0.1:${redisProxy.port}`, UPLOAD_END_RETRY_SECONDS: '1' },
    dbHost: `127.0.0.1:${pgProxy.port}`,
  });
});
afterAll(async () => {
  pgProxy?.restore();
  redisProxy?.restore();
  await s?.stop();
  await pgProxy?.close();
  await redisProxy?.close();
});

describe('health', () => {
  it("runs the service's Postgres sessions under the idle-in-transaction limit (test/lib/idle-transaction.test.ts)", async () => {
    const { rows } = await s.c.db.raw('SHOW idle_in_transaction_session_timeout');
    expect(rows).toEqual([{ idle_in_transaction_session_timeout: '1min' }]);
  });

  it('is 200 while Postgres and Redis answer', async () => {
    const res = await s.api('GET', '/health');
    expect(res.status).toBe(200);
  });

  it('answers at /health outside /api/v1 too (what load balancers probe), as /api/v1/health does', async () => {
    const root = await fetch(new URL('/health', s.url));
    expect(root.status).toBe(200);
    expect(root.headers.get('cache-control')).toBe('no-store');
    expect(await root.json()).toMatchObject({ status: 'ok', checks: { postgres: 'up', redis: 'up' } });
    redisProxy.cut();
    try {
      const down = await fetch(new URL('/health', s.url));
      expect([down.status, ((await down.json()) as { checks: unknown }).checks]).toEqual([503, { postgres: 'up', redis: 'down' }]);
    } finally {
      redisProxy.restore();
    }
    await expect.poll(async () => (await fetch(new URL('/health', s.url))).status, { timeout: 10_000, interval: 200 }).toBe(200);
  });

  it('is 503 with the failing check named while Redis is down, and recovers', async () => {
    redisProxy.cut();
    const res = await s.api('GET', '/health');
    expect(res.status).toBe(503);
    expect(res.body.checks).toEqual({ postgres: 'up', redis: 'down' });
    const login = await s.api('POST', '/auth/login', { body: { identifier: 'someone', password: 'whatever pw' } });
    expect(login.status).toBe(503);
    expect(login.headers.get('content-type')).toContain('problem+json');
    redisProxy.restore();
    await expect.poll(async () => (await s.api('GET', '/health')).status, { timeout: 10_000, interval: 200 }).toBe(200);
  });

  it('answers 503 database_unavailable with Retry-After to every request that needs Postgres while it is down', async () => {
    const u = await registerUser(s.api);
    pgProxy.cut();
    try {
      const tried = [
        await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } }),
        await s.api('POST', '/partners/register', { body: { username: 'newcomer', email: 'newcomer@example.test', password: 'correct horse battery staple' } }),
        await s.api('GET', '/keys/list', { token: u.token }),
        await s.api('GET', `/jobs/${randomUUID()}`, { token: u.token }),
      ];
      for (const res of tried) {
        expect([res.status, res.body.code]).toEqual([503, 'database_unavailable']);
        expect(res.headers.get('retry-after')).toMatch(/^\d+$/);
      }
    } finally {
      pgProxy.restore();
    }
    await expect.poll(async () => (await s.api('GET', '/keys/list', { token: u.token })).status, { timeout: 15_000, interval: 300 }).toBe(200);
  });

  it('answers an upload whose job was recorded, and which then could not reach Postgres, 503 with the job id', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const boundary = 'pgdown';
    const head = `--${boundary}\r\ncontent-disposition: form-data; name="fingerprint"\r\n\r\n${key.fingerprint}\r\n--${boundary}\r\ncontent-disposition: form-data; name="files"; filename="a.bin"\r\n\r\n`;
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const body = new ReadableStream<Uint8Array>({
      async start(controller) {
        controller.enqueue(Buffer.from(head + 'x'.repeat(1 << 16)));
        await gate;
        controller.enqueue(Buffer.from(`${'y'.repeat(1 << 16)}\r\n--${boundary}--\r\n`));
        controller.close();
      },
    });
    const answer = fetch(`${s.url}/keys/encrypt`, {
      method: 'POST',
      body,
      duplex: 'half',
      headers: { authorization: `Bearer ${u.token}`, 'content-type': `multipart/form-data; boundary=${boundary}` },
    });
    await expect.poll(async () => (await s.c.db('jobs').where({ user_id: u.id }).first())?.id, { timeout: 10_000 }).toBeDefined();
    const { id: jobId } = await s.c.db('jobs').where({ user_id: u.id }).first();
    pgProxy.cut();
    let res: Response;
    try {
      release();
      res = await answer;
    } finally {
      pgProxy.restore();
    }
    const problem = (await res.json()) as { code: string; job_id?: string; status_url?: string };
    expect([res.status, problem.code]).toEqual([503, 'database_unavailable']);
    expect(problem).toMatchObject({ job_id: jobId, status_url: `/api/v1/jobs/${jobId}` });
    await expect.poll(async () => (await s.api('GET', `/jobs/${jobId}`, { token: u.token })).status, { timeout: 15_000, interval: 300 }).toBe(200);
  });

  it('is 503 while Postgres is down, and recovers', async () => {
    pgProxy.cut();
    const res = await s.api('GET', '/health');
    expect(res.status).toBe(503);
    expect(res.body.checks.postgres).toBe('down');
    pgProxy.restore();
    await expect.poll(async () => (await s.api('GET', '/health')).status, { timeout: 15_000, interval: 300 }).toBe(200);
  });
});
