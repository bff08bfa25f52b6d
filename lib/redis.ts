import { Redis, type RedisOptions } from 'ioredis';

export type { Redis };

/** How long a producer's command may wait for Redis's answer before it fails (a frozen or partitioned server). */
export const PRODUCER_COMMAND_TIMEOUT_MS = 2000;

/**
 * Producer connections fail fast (no offline queue, and every command answered within
 * PRODUCER_COMMAND_TIMEOUT_MS) so an API request gets a 503 instead of hanging while Redis is down or
 * frozen; worker connections wait forever, as BullMQ requires for blocking commands.
 */
export function createRedis(url: string, role: 'producer' | 'worker', extra: RedisOptions = {}): Redis {
  const options: RedisOptions =
    role === 'producer'
      ? { enableOfflineQueue: false, maxRetriesPerRequest: 1, commandTimeout: PRODUCER_COMMAND_TIMEOUT_MS, lazyConnect: true, ...extra }
      : { maxRetriesPerRequest: null, enableReadyCheck: true, lazyConnect: true, ...extra };
  return new Redis(url, options);
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

/** Deletes every key under a prefix (test clean-up and `npm run` maintenance), in SCAN pages. */
export async function deleteKeysMatching(redis: Redis, pattern: string): Promise<number> {
  let cursor = '0';
  let deleted = 0;
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 500);
    cursor = next;
    if (keys.length) deleted += await redis.unlink(...keys);
  } while (cursor !== '0');
  return deleted;
}
