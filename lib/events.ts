import calculateSlot from 'cluster-key-slot';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from './redis';
import type { Container } from './container';
import { eventTargets, fanOut } from './services/webhooks';
import { accountsWithPendingEvents, deleteOutbox, insertOutbox, lockAccountOutbox, pendingEvents } from '../db/event-outbox';

/**
 * Account events go to a Redis stream per account, trimmed to the newest ~STREAM_MAX_LEN, delivered
 * live (`GET /events`, Server-Sent Events, resumable by stream id) and listed (`GET /events/history`).
 * Every event has one envelope, `{id, type, created_at, account, data}`; data names resources by id,
 * fingerprint and state only, never secrets. Every kind is published through `publishEvents`.
 */
export const EVENT_TYPES = [
  'key.generated',
  'key.disabled',
  'key.rotated',
  'key.rotation_failed',
  'key.expiring',
  'key.expired',
  'job.completed',
  'job.failed',
  'audit.recorded',
  'audit.checkpoint',
  'share.created',
  'share.revoked',
  'share.viewed',
  'api_key.created',
  'api_key.rotated',
  'api_key.revoked',
  'passkey.added',
  'passkey.removed',
  'billing.plan_changed',
  'billing.payment_failed',
  'team_access.linked',
  'team_access.synced',
  'team_access.unlinked',
  'team_access.requested',
  'team_access.approved',
  'organization.member_joined',
  'organization.member_removed',
  'key.destruction_scheduled',
  'key.destruction_cancelled',
  'key.generation_destroyed',
  'key.passphrase_failed',
  'key.imported',
  'key.signed',
  'key.verified',
] as const;
export type EventType = (typeof EVENT_TYPES)[number];

export interface AccountEvent {
  /** The stream id (`<ms>-<seq>`): increasing, and what `Last-Event-ID` resumes from. */
  id: string;
  type: EventType;
  created_at: string;
  /** The account (user id) the event belongs to. */
  account: string;
  data: Record<string, unknown>;
}

const STREAM_MAX_LEN = 1000;
export const EVENT_ID = /^\d{1,16}-\d{1,16}$/;

/**
 * How many groups a Redis Cluster spreads account streams over: each group is one hash slot, so one
 * blocking XREAD per group (an API process's event hub) follows every stream of it.
 */
export const EVENT_STREAM_GROUPS = 16;

/**
 * The hash tag of an account's stream and of the keys beside it. On one server it is the stream's own
 * name; on a cluster, the account's group, so that the streams of a group share a slot and the groups
 * spread over the shards.
 */
export const streamTag = (redisPrefix: string, userId: string, cluster: boolean) =>
  cluster ? `${redisPrefix}:events:g${calculateSlot(userId) % EVENT_STREAM_GROUPS}` : `${redisPrefix}:events:${userId}`;

export const eventStream = (redisPrefix: string, userId: string, cluster: boolean) => (cluster ? `{${streamTag(redisPrefix, userId, true)}}:${userId}` : streamTag(redisPrefix, userId, false));

/** A key in the hash slot of the account's event stream, so that one script may use both: publishEvents'. */
export const besideStream = (redisPrefix: string, userId: string, name: string, cluster: boolean) =>
  `{${streamTag(redisPrefix, userId, cluster)}}:${cluster ? `${userId}:` : ''}${name}`;

/** The version of the account's webhook endpoints, bumped on every change (lib/services/webhooks.ts). */
export const endpointsVersionKey = (redisPrefix: string, userId: string, cluster: boolean) => besideStream(redisPrefix, userId, 'webhook-endpoints', cluster);

/** An event to publish: its kind and its data (ids, fingerprints, states; never secrets). */
export interface NewEvent {
  type: EventType;
  data: Record<string, unknown>;
}

/** Publish only if `key` (made with besideStream) is new; it is kept for `seconds`. */
export interface Once {
  key: string;
  seconds: number;
}

/** What publishing answers: the events' stream ids, and the account's webhook endpoints version read with them. */
export interface Published {
  ids: string[];
  endpointsVersion: string | null;
}

/**
 * The GET of the account's webhook endpoints version (lib/services/webhooks.ts `eventTargets`) and an
 * XADD per event (ARGV from 4 on: type, data, ...), in order and in one round trip; with ARGV[1] > 0,
 * only if the SET NX of KEYS[3] succeeds (nil otherwise): of the processes that hear the same audit row,
 * one publishes it.
 */
const PUBLISH_LUA = `if ARGV[1] ~= '0' and not redis.call('SET', KEYS[3], '1', 'EX', ARGV[1], 'NX') then return false end
local out = {redis.call('GET', KEYS[2])}
for i = 4, #ARGV, 2 do
  out[#out + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'type', ARGV[i], 'data', ARGV[i + 1], 'at', ARGV[3])
end
return out`;

type Publisher = Redis & { kmsPublishEvents(...args: string[]): Promise<[string | null, ...string[]] | null> };

function publisher(redis: Redis): Publisher {
  // defineCommand: EVALSHA, and EVAL once when the server does not know the script yet.
  if (!('kmsPublishEvents' in redis)) redis.defineCommand('kmsPublishEvents', { numberOfKeys: 3, lua: PUBLISH_LUA });
  return redis as Publisher;
}

/** Appends events to the account's stream, in order; null when `once` was not new. Emitting code calls `emitEvents`, which also queues webhooks. */
export async function publishEvents(redis: Redis, redisPrefix: string, userId: string, events: NewEvent[], at: Date, once?: Once): Promise<Published | null> {
  const stream = eventStream(redisPrefix, userId, redis.isCluster);
  const fields = events.flatMap((e) => [e.type, JSON.stringify(e.data)]);
  const answer = await publisher(redis).kmsPublishEvents(stream, endpointsVersionKey(redisPrefix, userId, redis.isCluster), once?.key ?? stream, String(once?.seconds ?? 0), String(STREAM_MAX_LEN), at.toISOString(), ...fields);
  if (!answer) return null;
  const [endpointsVersion, ...ids] = answer;
  return { ids: ids as string[], endpointsVersion };
}

export type StreamEntry = [id: string, fields: string[]];

export function toEvent(userId: string, [id, fields]: StreamEntry): AccountEvent {
  const f: Record<string, string> = {};
  for (let i = 0; i < fields.length; i += 2) f[fields[i]!] = fields[i + 1]!;
  return { id, type: f.type as EventType, created_at: f.at ?? '', account: userId, data: JSON.parse(f.data ?? '{}') as Record<string, unknown> };
}

/** Events after `afterId` (exclusive), oldest first. */
export async function readEvents(redis: Redis, redisPrefix: string, userId: string, afterId = '-', count = 100): Promise<AccountEvent[]> {
  const start = afterId === '-' ? '-' : `(${afterId}`;
  const entries = (await redis.xrange(eventStream(redisPrefix, userId, redis.isCluster), start, '+', 'COUNT', count)) as StreamEntry[];
  return entries.map((e) => toEvent(userId, e));
}

/** The newest event id, or `0-0` when there is none: where a new live reader starts. */
export async function lastEventId(redis: Redis, redisPrefix: string, userId: string): Promise<string> {
  const [newest] = (await redis.xrevrange(eventStream(redisPrefix, userId, redis.isCluster), '+', '-', 'COUNT', 1)) as StreamEntry[];
  return newest?.[0] ?? '0-0';
}

/** Orders stream ids (`<ms>-<seq>`) numerically. */
export const compareEventIds = (a: string, b: string) => {
  const [am, as] = a.split('-').map(BigInt) as [bigint, bigint];
  const [bm, bs] = b.split('-').map(BigInt) as [bigint, bigint];
  return am === bm ? (as === bs ? 0 : as < bs ? -1 : 1) : am < bm ? -1 : 1;
};

/**
 * Whether a client resuming after `afterId` may have lost events to trimming: it must be told instead
 * of silently skipping them. The stream trims its oldest entries first, so while the entry `afterId`
 * itself is kept nothing after it was trimmed; once it is gone (or never existed) and newer events were
 * written, some may be. Cautious by one event: a client whose own last event was just trimmed hears it.
 */
export async function trimmedSince(redis: Redis, redisPrefix: string, userId: string, afterId: string): Promise<boolean> {
  const key = eventStream(redisPrefix, userId, redis.isCluster);
  if (((await redis.xrange(key, afterId, afterId)) as StreamEntry[]).length) return false;
  const info = (await redis.call('XINFO', 'STREAM', key).catch(() => null)) as unknown[] | null;
  if (!info) return false; // no stream: nothing was ever written
  const lastGenerated = String(info[info.indexOf('last-generated-id') + 1]);
  return compareEventIds(afterId, lastGenerated) < 0;
}

/** Stored events newest first, filtered by types and time (the stream holds the newest ~1000). */
export async function eventHistory(redis: Redis, redisPrefix: string, userId: string, q: { types?: EventType[]; from?: Date; to?: Date }): Promise<AccountEvent[]> {
  const end = q.to ? String(q.to.getTime()) : '+';
  const start = q.from ? String(q.from.getTime()) : '-';
  const entries = (await redis.xrevrange(eventStream(redisPrefix, userId, redis.isCluster), end, start)) as StreamEntry[];
  const events = entries.map((e) => toEvent(userId, e));
  return q.types?.length ? events.filter((e) => q.types!.includes(e.type)) : events;
}

/** How long a relayed event's Redis key is kept: a relayer that published it but could not delete its row skips it. */
const RELAYED_ONCE_SECONDS = 24 * 3600;
const RELAY_BATCH = 100;
/** How long, in all, an emitter retries while another process relays the same account before leaving its events to it. */
const RELAY_WAIT_MS = 2000;
const RELAY_RETRY_MS = 50;

/**
 * Emits account events once the change they report has committed: they are stored in Postgres (the
 * outbox), then published to the account's stream in order and their webhook deliveries queued
 * (relayEvents). When Redis cannot be reached they wait in the outbox, and the event relay publishes
 * them when it can. A failure is logged, not thrown: the change has happened and must not turn into an
 * error.
 */
export async function emitEvents(c: Container, userId: string, events: NewEvent[], once?: Once): Promise<void> {
  if (!events.length) return;
  const at = c.clock.now();
  try {
    // A `once` key stands for one event: the rows of a call are stored together or not at all.
    if (once && events.length > 1) throw new TypeError('a once-only emit carries one event');
    await insertOutbox(
      c.db,
      events.map((e) => ({ user_id: userId, type: e.type, data: e.data, once_key: once?.key ?? null, once_seconds: once?.seconds ?? null, created_at: at })),
    );
  } catch (err) {
    c.log.warn({ err, types: events.map((e) => e.type) }, 'could not store account events');
    return;
  }
  await relayEvents(c, userId, RELAY_WAIT_MS);
}

/** One event: see emitEvents. `once`: see publishEvents. */
export const emitEvent = (c: Container, userId: string, type: EventType, data: Record<string, unknown>, once?: Once): Promise<void> => emitEvents(c, userId, [{ type, data }], once);

/** The relay of each account running in this process: emitters that come meanwhile ask it to go round once more. */
const relaying = new WeakMap<Container, Map<string, { again: boolean; done: Promise<void> }>>();

/**
 * Publishes the account's stored events, oldest first, each once (a Redis key per event, kept a day),
 * queues their webhooks, and deletes them from the outbox; stops where Redis fails (the rest wait).
 * One relayer per account: in this process, callers share the running one; across processes, an
 * account lock in Postgres, retried for up to `waitMs` without holding a connection meanwhile.
 */
export function relayEvents(c: Container, userId: string, waitMs = 0): Promise<void> {
  let mine = relaying.get(c);
  if (!mine) relaying.set(c, (mine = new Map()));
  const running = mine.get(userId);
  if (running) {
    running.again = true;
    return running.done;
  }
  const state = { again: false, done: Promise.resolve() };
  state.done = (async () => {
    try {
      do {
        state.again = false;
        await relayAccount(c, userId, waitMs);
      } while (state.again);
    } catch (err) {
      c.log.warn({ err }, 'could not relay account events; they wait in the outbox');
    } finally {
      mine.delete(userId);
    }
  })();
  mine.set(userId, state);
  return state.done;
}

async function relayAccount(c: Container, userId: string, waitMs: number): Promise<void> {
  const prefix = c.config.redisPrefix;
  const deadline = Date.now() + waitMs;
  for (;;) {
    if (c.redis.status !== 'ready') return;
    // The transaction holds one pooled connection and asks for no other (no query on c.db inside it), so a
    // full pool cannot deadlock on it; webhooks are queued once it has committed.
    const published: { event: AccountEvent; endpointsVersion: string | null }[] = [];
    const outcome = await c.db.transaction(async (trx): Promise<'busy' | 'more' | 'done'> => {
      if (!(await lockAccountOutbox(trx, userId))) return 'busy';
      const rows = await pendingEvents(trx, userId, RELAY_BATCH);
      const done: string[] = [];
      try {
        for (const row of rows) {
          const once = { key: row.once_key ?? besideStream(prefix, userId, `outbox:${row.id}`, c.redis.isCluster), seconds: row.once_seconds ?? RELAYED_ONCE_SECONDS };
          const event: NewEvent = { type: row.type as EventType, data: row.data };
          const answer = await publishEvents(c.redis, prefix, userId, [event], row.created_at, once);
          done.push(row.id);
          // Null: published already (by another process hearing the same audit row, or before a failed delete).
          if (answer) published.push({ event: { id: answer.ids[0]!, type: event.type, created_at: row.created_at.toISOString(), account: userId, data: event.data }, endpointsVersion: answer.endpointsVersion });
        }
      } catch (err) {
        c.log.warn({ err, waiting: rows.length - done.length }, 'could not publish account events; they wait in the outbox');
        await deleteOutbox(trx, done);
        return 'done';
      }
      await deleteOutbox(trx, done);
      return rows.length === RELAY_BATCH ? 'more' : 'done';
    });
    for (const { event, endpointsVersion } of published) {
      await fanOut(c, event, await eventTargets(c, userId, endpointsVersion)).catch((err: unknown) => c.log.warn({ err, type: event.type }, 'could not queue the webhooks of an account event'));
    }
    if (outcome === 'done') return;
    if (outcome === 'busy') {
      // Another process relays this account; it may have read the outbox before these events were in it.
      if (Date.now() >= deadline) return;
      await sleep(RELAY_RETRY_MS);
    }
  }
}

const RELAY_INTERVAL_MS = 2000;

/** Publishes events that could not be published when they were emitted (Redis was down), every two seconds. */
export function startEventRelay(c: Container): { stop(): Promise<void> } {
  let running: Promise<void> | undefined;
  const tick = async () => {
    if (c.redis.status !== 'ready') return;
    const accounts = await accountsWithPendingEvents(c.db, RELAY_BATCH).catch(() => [] as string[]);
    for (const userId of accounts) await relayEvents(c, userId, 0);
  };
  const timer = setInterval(() => void (running ??= tick().finally(() => (running = undefined))), RELAY_INTERVAL_MS);
  timer.unref();
  return {
    async stop() {
      clearInterval(timer);
      await running;
    },
  };
}
