import calculateSlot from 'cluster-key-slot';
import { Cluster, Redis as SingleRedis, type RedisOptions } from 'ioredis';

/** A connection to one Redis server or to a Redis Cluster: the rest of the service uses either alike. */
export type Redis = SingleRedis | Cluster;
export type { SingleRedis };

/**
 * Where Redis is: one server (REDIS_URL), or a Redis Cluster found from its seed nodes
 * (REDIS_CLUSTER_NODES), with REDIS_URL's user, password and scheme (`rediss:` for TLS) used on every node.
 */
export interface RedisTarget {
  redisUrl: string;
  redisClusterNodes: { host: string; port: number }[];
}

/** How long a producer's command may wait for Redis's answer before it fails (a frozen or partitioned server). */
const PRODUCER_COMMAND_TIMEOUT_MS = 2000;

/**
 * Producer connections fail fast (no offline queue, and every command answered within
 * PRODUCER_COMMAND_TIMEOUT_MS) so an API request gets a 503 instead of hanging while Redis is down or
 * frozen; worker connections wait forever, as BullMQ requires for blocking commands.
 */
export function createRedis(target: RedisTarget, role: 'producer' | 'worker', extra: RedisOptions = {}): Redis {
  const producer = role === 'producer';
  const perServer: RedisOptions = producer ? { maxRetriesPerRequest: 1, commandTimeout: PRODUCER_COMMAND_TIMEOUT_MS } : { maxRetriesPerRequest: null };
  if (!target.redisClusterNodes.length)
    return new SingleRedis(target.redisUrl, { enableOfflineQueue: !producer, enableReadyCheck: true, lazyConnect: true, ...perServer, ...extra });
  const url = new URL(target.redisUrl);
  return new Cluster(target.redisClusterNodes, {
    lazyConnect: true,
    enableOfflineQueue: !producer,
    // No ready check: when it fails (cluster_state:fail during a failover) ioredis reconnects without
    // ever settling the promise connect() returned, and BullMQ awaits that promise when it resets a
    // worker's blocking connection, so the worker would stop fetching jobs for good. Commands sent while
    // the cluster is down wait and retry (retryDelayOnClusterDown) as they would after a ready check.
    enableReadyCheck: false,
    // While a replica takes over a failed primary (cluster-node-timeout, then the election), commands
    // routed to its slots wait and are sent again: a producer's up to its own deadline, a worker's for a
    // minute (cluster-node-timeout is 15 s by default), as a worker on one server waits for it to return.
    maxRedirections: producer ? 16 : 300,
    retryDelayOnFailover: 200,
    retryDelayOnClusterDown: 200,
    retryDelayOnTryAgain: 200,
    // An idle connection (a blocking reader) hears of a failover from this poll, not from a failed command.
    slotsRefreshInterval: 2000,
    redisOptions: {
      username: decodeURIComponent(url.username) || undefined,
      password: decodeURIComponent(url.password) || undefined,
      tls: url.protocol === 'rediss:' ? {} : undefined,
      ...perServer,
      ...extra,
    },
  });
}

/** Resolves once connected, or rejects after `timeoutMs` (start-up should fail loudly, not hang). */
export async function connectRedis(redis: Redis, timeoutMs = 10_000): Promise<void> {
  if (redis.status === 'ready') return;
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    redis.status === 'wait' ? redis.connect() : new Promise<void>((resolve) => redis.once('ready', () => resolve())),
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`Redis not reachable within ${timeoutMs} ms`)), timeoutMs);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** The servers that hold keys: the one server, or each primary of a cluster (SCAN and KEYS see one server's keys). */
const primaries = (redis: Redis): SingleRedis[] => (redis instanceof Cluster ? redis.nodes('master') : [redis]);

const addressOf = (server: SingleRedis) => `${server.options.host}:${server.options.port}`;

/**
 * The connection to the server holding `key`'s slot (the client itself on one server): for commands
 * about a connection (CLIENT ID) that must reach the server a blocking read on `key` waits on.
 */
export function serverOf(redis: Redis, key: string): SingleRedis | undefined {
  if (!(redis instanceof Cluster)) return redis;
  const owner = redis.slots[calculateSlot(key)]?.[0];
  return redis.nodes('master').find((n) => addressOf(n) === owner);
}

/** This client's connection to the server `other` is connected to (the client itself on one server). */
export function sameServer(redis: Redis, other: SingleRedis): SingleRedis | undefined {
  if (!(redis instanceof Cluster)) return redis;
  return redis.nodes().find((n) => addressOf(n) === addressOf(other));
}

/** Every key matching `pattern`, on every primary, in SCAN pages. */
export async function* scanKeys(redis: Redis, pattern: string): AsyncGenerator<{ server: SingleRedis; keys: string[] }> {
  for (const server of primaries(redis)) {
    let cursor = '0';
    do {
      const [next, keys] = await server.scan(cursor, 'MATCH', pattern, 'COUNT', 500);
      cursor = next;
      if (keys.length) yield { server, keys };
    } while (cursor !== '0');
  }
}

/** Deletes every key under a prefix (test clean-up and `npm run` maintenance). */
export async function deleteKeysMatching(redis: Redis, pattern: string): Promise<number> {
  let deleted = 0;
  for await (const { server, keys } of scanKeys(redis, pattern)) {
    // One key per command: on a cluster, the keys of one page lie in different slots.
    const answers = (await keys.reduce((p, key) => p.unlink(key), server.pipeline()).exec()) ?? [];
    deleted += answers.reduce((n, [, removed]) => n + Number(removed ?? 0), 0);
  }
  return deleted;
}
