import { hostname } from 'node:os';
import { randomUUID } from 'node:crypto';
import { scanKeys, type Redis } from './redis';

/**
 * Each worker process says it is alive: a Redis key per process with its queues and concurrency,
 * refreshed every HEARTBEAT_MS and expiring after TTL_MS, so a killed process drops out on its own.
 */
const HEARTBEAT_MS = 5000;
const TTL_MS = 15_000;

export interface WorkerBeat {
  id: string;
  host: string;
  pid: number;
  queues: { queue: string; concurrency: number }[];
  started_at: string;
  seen_at: string;
}

/** One hash tag for every beat, so that one MGET reads them on a Redis Cluster too. */
const keyOf = (prefix: string, id: string) => `{${prefix}:workers}:${id}`;

export function startHeartbeat(redis: Redis, prefix: string, queues: WorkerBeat['queues']): { stop: () => Promise<void> } {
  const id = randomUUID();
  const base = { id, host: hostname(), pid: process.pid, queues, started_at: new Date().toISOString() };
  const beat = () => redis.set(keyOf(prefix, id), JSON.stringify({ ...base, seen_at: new Date().toISOString() }), 'PX', TTL_MS).catch(() => undefined);
  void beat();
  const timer = setInterval(() => void beat(), HEARTBEAT_MS);
  timer.unref();
  return {
    async stop() {
      clearInterval(timer);
      await redis.del(keyOf(prefix, id)).catch(() => undefined);
    },
  };
}

/** The worker processes alive now. */
export async function liveWorkers(redis: Redis, prefix: string): Promise<WorkerBeat[]> {
  const keys: string[] = [];
  for await (const page of scanKeys(redis, keyOf(prefix, '*'))) keys.push(...page.keys);
  if (!keys.length) return [];
  const values = await redis.mget(...keys);
  return values.filter((v): v is string => Boolean(v)).map((v) => JSON.parse(v) as WorkerBeat);
}
