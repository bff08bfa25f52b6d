import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../support/service';
import { startRedisServer } from '../support/redis-server';
import { startProxy } from '../support/proxy';
import { startProcess, waitForOutput } from '../support/process';

let s: TestService;
let redis: Awaited<ReturnType<typeof startRedisServer>>;
let pgProxy: Awaited<ReturnType<typeof startProxy>>;

beforeAll(async () => {
  s = await startTestService({ roles: ['web'] });
  redis = await startRedisServer();
  const db = new URL(s.env.DATABASE_URL);
  pgProxy = await startProxy(db.hostname, Number(db.port || 5432));
});
afterAll(async () => {
  await s?.stop();
  await redis?.stop();
  await pgProxy?.close();
});

describe('while Redis and Postgres go away and come back', () => {
  it('every process writes nothing but one JSON record per line', async () => {
    const db = new URL(s.env.DATABASE_URL);
    db.host = `127.0.0.1:${pgProxy.port}`;
    const env = { ...s.env, REDIS_URL: redis.url, DATABASE_URL: db.toString(), LOG_LEVEL: 'info' };
    const processes = [startProcess('web', env), startProcess('worker', env), startProcess('scheduler', env)];
    try {
      await waitForOutput(processes[0], 'api listening');
      await waitForOutput(processes[1], 'workers started');
      await waitForOutput(processes[2], 'scheduler started');
      // Postgres first, while a login needs it; then Redis too.
      pgProxy.cut();
      const api = `http://127.0.0.1:${/"port":(\d+)/.exec(processes[0].output())?.[1]}/api/v1`;
      const login = await fetch(`${api}/auth/login`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ identifier: 'someone', password: 'some password' }),
      });
      expect(login.status).toBe(503);
      await new Promise((r) => setTimeout(r, 1500));
      await redis.stop();
      await new Promise((r) => setTimeout(r, 3000));
      pgProxy.restore();
      await redis.start();
      await new Promise((r) => setTimeout(r, 3000));
      for (const p of processes) {
        const lines = p
          .output()
          .split('\n')
          .filter((l) => l.trim());
        expect(lines.length).toBeGreaterThan(1);
        const notJson = lines.filter((l) => {
          try {
            return typeof JSON.parse(l) !== 'object';
          } catch {
            return true;
          }
        });
        expect(notJson, p.output().slice(-3000)).toEqual([]);
      }
    } finally {
      for (const p of processes) p.kill('SIGKILL');
      await Promise.all(processes.map((p) => p.exited));
    }
  }, 90_000);

  it('a worker says once that Redis is out of reach, however many of its connections retry, and once that it is back', async () => {
    const own = await startRedisServer();
    const worker = startProcess('worker', { ...s.env, REDIS_URL: own.url, LOG_LEVEL: 'info' });
    const records = (text: string) =>
      text
        .split('\n')
        .filter((l) => l.trim())
        .map((l) => JSON.parse(l) as { level: number; msg: string });
    try {
      await waitForOutput(worker, 'workers started');
      const from = worker.output().length;
      // Ten seconds of reconnections, each heard by every connection and by the BullMQ worker of every queue.
      await own.stop();
      await new Promise((r) => setTimeout(r, 10_000));
      const down = records(worker.output().slice(from));
      await own.start();
      await waitForOutput(worker, 'redis is reachable again');
      const loud = down.filter((r) => r.level >= 40);
      expect(loud.filter((r) => r.msg === 'redis is out of reach; retrying')).toHaveLength(1);
      // The loss, and room for a line that is not about Redis (a start-up warning written late).
      expect(loud.length, JSON.stringify(loud)).toBeLessThanOrEqual(2);
      expect(records(worker.output().slice(from)).filter((r) => r.msg === 'redis is reachable again')).toHaveLength(1);
    } finally {
      worker.kill('SIGKILL');
      await worker.exited;
      await own.stop();
    }
  }, 60_000);
});
