import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { waitingForConnection } from '../../db/knex';
import { registerUser, startTestService, type TestService } from '../support/service';

const LIMIT = 2;
let s: TestService;

beforeAll(async () => {
  s = await startTestService({ roles: ['web'], env: { DB_WAITING_LIMIT: String(LIMIT) } });
});
afterAll(async () => {
  await s?.stop();
});

/** Takes every pooled connection of the API's database handle, as a burst of slow queries would. */
async function holdPool(): Promise<() => void> {
  const client = s.c.db.client as { acquireConnection(): Promise<unknown>; releaseConnection(conn: unknown): Promise<void>; pool: { max: number } };
  const conns = await Promise.all(Array.from({ length: client.pool.max }, () => client.acquireConnection()));
  return () => conns.forEach((conn) => void client.releaseConnection(conn));
}

describe('load shedding (DB_WAITING_LIMIT)', () => {
  it('answers 503 overloaded with Retry-After while the limit of requests waits for Postgres, and lets the waiting ones finish', async () => {
    const user = await registerUser(s.api);
    const release = await holdPool();
    const waiting: Promise<{ status: number }>[] = [];
    try {
      // One request at a time until LIMIT queries wait (a request may wait for more than one connection).
      while (waitingForConnection(s.c.db) < LIMIT) {
        const before = waitingForConnection(s.c.db);
        waiting.push(s.api('GET', '/keys/list', { token: user.token }));
        await vi.waitUntil(() => waitingForConnection(s.c.db) > before, { timeout: 5000, interval: 5 });
      }

      const shed = await s.api('GET', '/keys/list', { token: user.token });
      expect(shed.status).toBe(503);
      expect(shed.headers.get('content-type')).toContain('application/problem+json');
      expect(shed.headers.get('retry-after')).toBe('1');
      expect(shed.body).toMatchObject({ status: 503, code: 'overloaded' });
      // Shed before anything runs: an unauthenticated request gets the same answer, not a 401.
      expect((await s.api('GET', '/keys/list')).body.code).toBe('overloaded');
      // Readiness still answers for itself (its own verdict on Postgres, not the shedding's).
      expect((await s.api('GET', '/health')).body.code).toBeUndefined();
    } finally {
      release();
    }
    // The requests let in were delayed, not dropped.
    expect(waiting.length).toBeGreaterThan(0);
    expect((await Promise.all(waiting)).map((r) => r.status)).toEqual(waiting.map(() => 200));
    expect((await s.api('GET', '/keys/list', { token: user.token })).status).toBe(200);
  });
});
