import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { startRedisServer } from '../support/redis-server';
import { emitEvent, emitEvents } from '../../lib/events';
import { besideStream } from '../../lib/event-stream';

let redis: Awaited<ReturnType<typeof startRedisServer>>;
let s: TestService;

beforeAll(async () => {
  redis = await startRedisServer();
  s = await startTestService({ roles: ['web', 'scheduler'], env: { REDIS_URL: redis.url } });
});
afterAll(async () => {
  await s?.stop();
  await redis?.stop();
});

const history = async (token: string) => (await s.api('GET', '/events/history?types=keys.rotated', { token })).body.items as { data: { n: number } }[];

describe('account events while Redis is down', () => {
  it('wait in the outbox and are published when Redis is back: in order, each once', async () => {
    const u = await registerUser(s.api);
    await emitEvent(s.c, u.id, 'keys.rotated', { n: 1 });
    await redis.stop();
    // The changes happened: their events must not be lost, and emitting must not fail.
    await emitEvent(s.c, u.id, 'keys.rotated', { n: 2 });
    await emitEvents(s.c, u.id, [
      { type: 'keys.rotated', data: { n: 3 } },
      { type: 'keys.rotated', data: { n: 4 } },
    ]);
    expect(Number((await s.c.db('event_outbox').where({ user_id: u.id }).count<{ n: string }>({ n: '*' }).first())!.n)).toBe(3);

    // Redis comes back empty: what it lost is gone, but what waited in the outbox is told.
    await redis.start();
    let seen: number[] = [];
    for (let i = 0; i < 100 && seen.length < 3; i++) {
      await new Promise((r) => setTimeout(r, 200));
      seen = (await history(u.token).catch(() => [])).map((e) => e.data.n).reverse();
    }
    expect(seen).toEqual([2, 3, 4]);
    expect(Number((await s.c.db('event_outbox').count<{ n: string }>({ n: '*' }).where({ user_id: u.id }).first())!.n)).toBe(0);

    // A relayer that published but could not delete its rows does not publish them twice.
    await emitEvent(s.c, u.id, 'keys.rotated', { n: 5 });
    expect((await history(u.token)).map((e) => e.data.n).reverse()).toEqual([2, 3, 4, 5]);
  });

  it('an event heard by several processes (the same once key) is published once', async () => {
    const u = await registerUser(s.api);
    const once = { key: besideStream(s.c.config.redisPrefix, u.id, 'test-once', s.c.redis.isCluster), seconds: 60 };
    await Promise.all([1, 2, 3].map(() => emitEvent(s.c, u.id, 'keys.rotated', { n: 1 }, once)));
    expect(await history(u.token)).toHaveLength(1);
  });
});
