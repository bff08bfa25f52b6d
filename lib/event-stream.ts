import calculateSlot from 'cluster-key-slot';
import type { Redis } from './redis';
import type { EventType } from './event-names';

/**
 * Account events go to a Redis stream per account, trimmed to the newest ~STREAM_MAX_LEN, delivered
 * live (`GET /events`, Server-Sent Events, resumable by stream id) and listed (`GET /events/history`).
 * Every event has one envelope, `{id, type, created_at, account, data}`; data names resources by id,
 * fingerprint and state only, never secrets. Every kind is published through `publishEvents`.
 */

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

export const eventStream = (redisPrefix: string, userId: string, cluster: boolean) =>
  cluster ? `{${streamTag(redisPrefix, userId, true)}}:${userId}` : streamTag(redisPrefix, userId, false);

/** A key in the hash slot of the account's event stream, so that one script may use both: publishEvents'. */
export const besideStream = (redisPrefix: string, userId: string, name: string, cluster: boolean) =>
  `{${streamTag(redisPrefix, userId, cluster)}}:${cluster ? `${userId}:` : ''}${name}`;

/** The version of the account's webhook endpoints, bumped on every change (lib/webhooks/endpoints.ts). */
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
 * The GET of the account's webhook endpoints version (lib/webhooks/endpoints.ts `eventTargets`) and an
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
  const answer = await publisher(redis).kmsPublishEvents(
    stream,
    endpointsVersionKey(redisPrefix, userId, redis.isCluster),
    once?.key ?? stream,
    String(once?.seconds ?? 0),
    String(STREAM_MAX_LEN),
    at.toISOString(),
    ...fields,
  );
  if (!answer) return null;
  const [endpointsVersion, ...ids] = answer;
  return { ids: ids, endpointsVersion };
}

export type StreamEntry = [id: string, fields: string[]];

export function toEvent(userId: string, [id, fields]: StreamEntry): AccountEvent {
  const f: Record<string, string> = {};
  for (let i = 0; i < fields.length; i += 2) f[fields[i]] = fields[i + 1]!;
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
export async function eventHistory(
  redis: Redis,
  redisPrefix: string,
  userId: string,
  q: { types?: EventType[]; from?: Date; to?: Date },
): Promise<AccountEvent[]> {
  const end = q.to ? String(q.to.getTime()) : '+';
  const start = q.from ? String(q.from.getTime()) : '-';
  const entries = (await redis.xrevrange(eventStream(redisPrefix, userId, redis.isCluster), end, start)) as StreamEntry[];
  const events = entries.map((e) => toEvent(userId, e));
  return q.types?.length ? events.filter((e) => q.types!.includes(e.type)) : events;
}
