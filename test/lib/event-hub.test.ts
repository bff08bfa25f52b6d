import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { inject } from 'vitest';
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { EventHub } from '../../lib/event-hub';
import { besideStream, endpointsVersionKey, eventStream, publishEvents, readEvents, type Once } from '../../lib/event-stream';
import type { EventType } from '../../lib/event-names';
import { createLogger } from '../../lib/logger';
import { deleteKeysMatching } from '../../lib/redis';
import { RedisOutageLog } from '../../lib/redis-outage';

/** The per-process event hub against the real Redis: one reader, every listener exactly once and in order. */
const prefix = `${inject('runId')}_hub${randomBytes(3).toString('hex')}`;
let redis: Redis;
let hub: EventHub;
beforeAll(() => {
  redis = new Redis(inject('redisUrl'));
  hub = new EventHub({
    redis,
    target: { redisUrl: inject('redisUrl'), redisClusterNodes: [] },
    redisPrefix: prefix,
    log: createLogger('silent'),
    outage: new RedisOutageLog(createLogger('silent')),
  });
});
afterAll(async () => {
  await hub.stop();
  await deleteKeysMatching(redis, `*${prefix}*`); // keys beside a stream begin with its hash tag
  redis.disconnect();
});

const publishEvent = (user: string, type: EventType, data: Record<string, unknown>, once?: Once) =>
  publishEvents(redis, prefix, user, [{ type, data }], new Date(), once);
const publish = async (user: string, n: number) => (await publishEvent(user, 'keys.generated', { n }))!.ids[0];
const collector = () => {
  const seen: number[] = [];
  return { seen, deliver: (events: { data: Record<string, unknown> }[]) => seen.push(...events.map((e) => e.data.n as number)) };
};
const until = (check: () => boolean, ms = 5000) => expect.poll(check, { timeout: ms, interval: 10 }).toBe(true);

describe('EventHub', () => {
  it('gives each listener every event after its own cursor exactly once, in order, however it joins', async () => {
    const first = collector();
    const stopFirst = await hub.listen('a', '0-0', first.deliver);
    const ids: string[] = [];
    for (let n = 0; n < 5; n++) ids.push(await publish('a', n));
    await until(() => first.seen.length === 5);

    // Joins behind the hub (it already read up to event 4): catches up from its cursor, then live.
    const behind = collector();
    const stopBehind = await hub.listen('a', ids[1], behind.deliver);
    // Joins ahead of what it would be given again: nothing twice.
    const ahead = collector();
    const stopAhead = await hub.listen('a', ids[4], ahead.deliver);
    for (let n = 5; n < 8; n++) await publish('a', n);
    await until(() => first.seen.length === 8 && behind.seen.length === 6 && ahead.seen.length === 3);
    expect(first.seen).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(behind.seen).toEqual([2, 3, 4, 5, 6, 7]);
    expect(ahead.seen).toEqual([5, 6, 7]);
    stopFirst();
    stopBehind();
    stopAhead();
  });

  it('loses nothing and repeats nothing for a listener that joins while events are being written', async () => {
    const writer = (async () => {
      for (let n = 0; n < 300; n++) await publish('b', n);
    })();
    await new Promise((r) => setTimeout(r, 5));
    const early = collector();
    const stopEarly = await hub.listen('b', '0-0', early.deliver);
    await new Promise((r) => setTimeout(r, 20));
    // Its cursor is behind what the hub has already read for `early`.
    const late = collector();
    const stopLate = await hub.listen('b', '0-0', late.deliver);
    await writer;
    await until(() => early.seen.length === 300 && late.seen.length === 300);
    const all = Array.from({ length: 300 }, (_, n) => n);
    expect(early.seen).toEqual(all);
    expect(late.seen).toEqual(all);
    stopEarly();
    stopLate();
  });

  it('follows many streams on one Redis connection, and a stream added while the reader blocks is read at once', async () => {
    const users = Array.from({ length: 50 }, (_, i) => `many${i}`);
    const got = new Map(users.map((u) => [u, collector()]));
    const stops = await Promise.all(users.map((u) => hub.listen(u, '0-0', got.get(u)!.deliver)));
    await Promise.all(users.map((u, i) => publish(u, i)));
    await until(() => users.every((u) => got.get(u)!.seen.length === 1));
    expect(users.map((u) => got.get(u)!.seen[0])).toEqual(users.map((_, i) => i));

    const readers = (await redis.client('LIST')) as string;
    expect(readers.split('\n').filter((line) => line.includes(` name=${prefix}:event-hub `))).toHaveLength(1);

    await new Promise((r) => setTimeout(r, 200)); // the reader is blocked in XREAD now
    const fresh = collector();
    const started = Date.now();
    const stopFresh = await hub.listen('fresh', '0-0', fresh.deliver);
    await publish('fresh', 1);
    await until(() => fresh.seen.length === 1, 9000);
    expect(Date.now() - started).toBeLessThan(5000); // interrupted, not left waiting for the 10 s block
    stopFresh();
    for (const stop of stops) stop();
  });

  it('keeps a stream in the read a while after its last listener left: the next one joins without an interruption', async () => {
    const first = collector();
    const stopFirst = await hub.listen('again', '0-0', first.deliver);
    const id0 = await publish('again', 0);
    await until(() => first.seen.length === 1);
    stopFirst();
    // Read by the hub while nobody listens; given to the next listener from its own cursor.
    await publish('again', 1);
    await publish('again', 2);
    await new Promise((r) => setTimeout(r, 100));
    const unblocks = vi.spyOn(redis, 'client');
    const next = collector();
    const stopNext = await hub.listen('again', id0, next.deliver);
    await publish('again', 3);
    await until(() => next.seen.length === 3);
    expect(next.seen).toEqual([1, 2, 3]);
    expect(unblocks.mock.calls.map((call) => String(call[0]))).not.toContain('UNBLOCK');
    unblocks.mockRestore();
    stopNext();
  });

  it('starts a listener without a cursor at now: from the newest id, or where the hub reads a stream it follows (no round trip)', async () => {
    await publish('now', 0);
    const first = collector();
    const stopFirst = await hub.listen('now', undefined, first.deliver);
    await publish('now', 1);
    await until(() => first.seen.length === 1);
    const reads = vi.spyOn(redis, 'xrevrange');
    const second = collector();
    const stopSecond = await hub.listen('now', undefined, second.deliver);
    await publish('now', 2);
    await until(() => second.seen.length === 1 && first.seen.length === 2);
    expect([first.seen, second.seen]).toEqual([[1, 2], [2]]);
    expect(reads).not.toHaveBeenCalled();
    reads.mockRestore();
    stopFirst();
    stopSecond();
  });
});

describe('publishEvents', () => {
  it('publishes once per `once` key, and reads the webhook endpoints version in the same round trip', async () => {
    // One script, so one Redis Cluster hash slot: the keys beside a stream are tagged with its name.
    expect(endpointsVersionKey(prefix, 'u1', false)).toBe(`{${eventStream(prefix, 'u1', false)}}:webhook-endpoints`);
    const user = randomBytes(4).toString('hex');
    const once = { key: besideStream(prefix, user, 'once', false), seconds: 60 };
    const first = await publishEvent(user, 'audit_logs.recorded', { n: 1 }, once);
    expect(first).toEqual({ ids: [expect.stringMatching(/^\d+-\d+$/)], endpointsVersion: null });
    // Another process hearing the same row: nothing is written.
    expect(await publishEvent(user, 'audit_logs.recorded', { n: 1 }, once)).toBeNull();
    expect(await redis.xlen(eventStream(prefix, user, false))).toBe(1);
    expect(await redis.ttl(once.key)).toBeGreaterThan(50);

    await redis.incr(endpointsVersionKey(prefix, user, false));
    expect((await publishEvent(user, 'keys.generated', { n: 2 }))?.endpointsVersion).toBe('1');
    expect(await redis.xlen(eventStream(prefix, user, false))).toBe(2);
  });

  it('appends several events in order in one round trip', async () => {
    const user = randomBytes(4).toString('hex');
    await publishEvent(user, 'keys.generated', { n: 0 });
    const sent = vi.spyOn(redis, 'sendCommand');
    const published = await publishEvents(
      redis,
      prefix,
      user,
      [
        { type: 'keys.rotated', data: { n: 1 } },
        { type: 'jobs.completed', data: { n: 2 } },
      ],
      new Date(),
    );
    expect(sent).toHaveBeenCalledTimes(1);
    sent.mockRestore();
    const events = await readEvents(redis, prefix, user);
    expect(events.map((e) => [e.type, e.data.n])).toEqual([
      ['keys.generated', 0],
      ['keys.rotated', 1],
      ['jobs.completed', 2],
    ]);
    expect(published?.ids).toEqual(events.slice(1).map((e) => e.id));
  });
});
