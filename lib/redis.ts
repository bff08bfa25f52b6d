import { AsyncLocalStorage } from 'node:async_hooks';
import calculateSlot from 'cluster-key-slot';
import { Cluster, Redis as SingleRedis, type Command, type RedisOptions } from 'ioredis';

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

/**
 * How long a producer's command may wait for Redis's answer before it fails (a frozen or partitioned
 * server), and how long all the commands of one request may wait in all (withRedisBudget).
 */
const PRODUCER_COMMAND_TIMEOUT_MS = 2000;

/**
 * The time one request's Redis commands have spent waiting for their answers. Time during which any of
 * them was unanswered counts once, however many were: commands sent together share the wait.
 */
class RedisBudget {
  private waitedMs = 0;
  private unanswered = 0;
  private since = 0;
  /** Commands already charged: a Redis Cluster sends a command again on a redirection, as the same Command. */
  private readonly charged = new WeakSet<Command>();

  constructor(private readonly budgetMs: number) {}

  /**
   * The command gets what is left of the budget as its timeout (none once it is spent: it is still sent,
   * so a command given back behind an earlier one, a rate-limit point, still reaches Redis after it).
   */
  charge(command: Command): void {
    if (this.charged.has(command)) return;
    this.charged.add(command);
    command.setTimeout(this.wait(command.promise));
  }

  /** Counts the time until `answer` settles as waiting; answers what was left of the budget when it began. */
  wait(answer: Promise<unknown>): number {
    const now = Date.now();
    const left = Math.max(0, this.budgetMs - this.waitedMs - (this.unanswered ? now - this.since : 0));
    if (!this.unanswered++) this.since = now;
    const answered = () => {
      if (!--this.unanswered) this.waitedMs += Date.now() - this.since;
    };
    answer.then(answered, answered);
    return left;
  }
}

const requestBudgets = new AsyncLocalStorage<RedisBudget>();

/**
 * Runs `work` (serving one request) with one budget for its Redis work: the producer commands it sends
 * wait PRODUCER_COMMAND_TIMEOUT_MS in all for their answers, not each, so a request that meets a frozen
 * Redis twice (a swallowed event publication, then its enqueue) still answers within that bound.
 */
export const withRedisBudget = <T>(work: () => Promise<T>): Promise<T> => requestBudgets.run(new RedisBudget(PRODUCER_COMMAND_TIMEOUT_MS), work);

/**
 * Waits for Redis work that someone else started and this request now needs (a queue's start, an
 * account's event relay under way) no longer than what is left of the request's budget, which the wait
 * spends; past it, rejects as a command that timed out. Outside a request, it is `work` itself.
 */
export function withinRedisBudget<T>(work: Promise<T>): Promise<T> {
  const budget = requestBudgets.getStore();
  if (!budget) return work;
  let settled!: () => void;
  const left = budget.wait(new Promise<void>((resolve) => (settled = resolve)));
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error("Command timed out: the request's wait for Redis is spent")), left);
  });
  return Promise.race([work, late]).finally(() => {
    clearTimeout(timer);
    settled();
  });
}

/** A producer's connection to one server: while serving a request, its commands share the request's budget. */
class ProducerRedis extends SingleRedis {
  override sendCommand(...args: Parameters<SingleRedis['sendCommand']>): unknown {
    requestBudgets.getStore()?.charge(args[0]);
    return super.sendCommand(...args);
  }
}

/** A producer's Redis Cluster client: the same, for the whole of a command's routing (redirections included). */
class ProducerCluster extends Cluster {
  override sendCommand(...args: Parameters<Cluster['sendCommand']>): unknown {
    requestBudgets.getStore()?.charge(args[0]);
    return super.sendCommand(...args);
  }
}

/**
 * Producer connections fail fast (no offline queue, every command answered within
 * PRODUCER_COMMAND_TIMEOUT_MS, a request's commands within it in all) so an API request gets a 503
 * instead of hanging while Redis is down or frozen; worker connections wait forever, as BullMQ requires
 * for blocking commands.
 */
export function createRedis(target: RedisTarget, role: 'producer' | 'worker', extra: Omit<RedisOptions, 'replyMapping'> = {}): Redis {
  const producer = role === 'producer';
  const perServer: Omit<RedisOptions, 'replyMapping'> = producer
    ? { maxRetriesPerRequest: 1, commandTimeout: PRODUCER_COMMAND_TIMEOUT_MS }
    : { maxRetriesPerRequest: null };
  if (!target.redisClusterNodes.length) {
    const Client = producer ? ProducerRedis : SingleRedis;
    return new Client(target.redisUrl, { enableOfflineQueue: !producer, enableReadyCheck: true, lazyConnect: true, ...perServer, ...extra });
  }
  const url = new URL(target.redisUrl);
  const Client = producer ? ProducerCluster : Cluster;
  return new Client(target.redisClusterNodes, {
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
