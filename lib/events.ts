import type { Redis } from 'ioredis';

/**
 * Account events (key rotated, rotation failed, key expiring, …) go to a Redis stream per account,
 * trimmed to the newest ~1000, for live delivery to the account owner. Payloads name resources by
 * id and fingerprint only; never secrets.
 */
export type EventType = 'key.rotated' | 'key.rotation_failed' | 'key.expiring' | 'key.expired';

export const eventStream = (redisPrefix: string, userId: string) => `${redisPrefix}:events:${userId}`;

export async function publishEvent(redis: Redis, redisPrefix: string, userId: string, type: EventType, data: Record<string, unknown>, at: Date): Promise<string | null> {
  return redis.xadd(eventStream(redisPrefix, userId), 'MAXLEN', '~', '1000', '*', 'type', type, 'data', JSON.stringify(data), 'at', at.toISOString());
}

export interface StoredEvent {
  id: string;
  type: EventType;
  data: Record<string, unknown>;
  at: string;
}

/** Events after `afterId` (exclusive), oldest first. */
export async function readEvents(redis: Redis, redisPrefix: string, userId: string, afterId = '-', count = 100): Promise<StoredEvent[]> {
  const start = afterId === '-' ? '-' : `(${afterId}`;
  const entries = await redis.xrange(eventStream(redisPrefix, userId), start, '+', 'COUNT', count);
  return entries.map(([id, fields]) => {
    const f: Record<string, string> = {};
    for (let i = 0; i < fields.length; i += 2) f[fields[i]!] = fields[i + 1]!;
    return { id, type: f.type as EventType, data: JSON.parse(f.data ?? '{}') as Record<string, unknown>, at: f.at ?? '' };
  });
}
