import { hostname } from 'node:os';
import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import { scanKeys, type Redis } from './redis';
import type { RedisOutageLog } from './redis-outage';
import type { KeyringState } from './root-of-trust/keyring';

/**
 * Each service process (API, worker, scheduler) says it is alive: a Redis key per process with its
 * roles, the queues it consumes and the data key it seals under, refreshed every HEARTBEAT_MS and at
 * once when its keyring changes, and expiring after TTL_MS, so a killed process drops out on its own.
 * `master-key rotate` reads which processes take the maintenance queue, `master-key retire` which
 * processes have not loaded the current data key.
 */
const HEARTBEAT_MS = 5000;
const TTL_MS = 15_000;

const QueueShare = z.object({ queue: z.string(), concurrency: z.number().int() });
const KeyringBeat: z.ZodType<KeyringState> = z.object({
  current_kid: z.string().nullable(),
  loaded_at: z.string().nullable(),
  reload_error: z.string().nullable(),
});

const ProcessBeat = z.object({
  id: z.string(),
  host: z.string(),
  pid: z.number().int(),
  /** Read as a worker's when missing: a process that writes no roles beats only from its workers. */
  roles: z.array(z.string()).default(['worker']),
  queues: z.array(QueueShare),
  /** Missing from a process that does not say which data key it seals under: it counts as behind. */
  keyring: KeyringBeat.optional(),
  started_at: z.string(),
  seen_at: z.string(),
});
export type ProcessBeat = z.infer<typeof ProcessBeat>;

/** One hash tag for every beat, so that one MGET reads them on a Redis Cluster too. */
const keyOf = (prefix: string, id: string) => `{${prefix}:workers}:${id}`;

export function startHeartbeat(
  redis: Redis,
  prefix: string,
  who: Pick<ProcessBeat, 'roles' | 'queues'>,
  now: () => { keyring: KeyringState },
  outage: RedisOutageLog,
): { beat: () => void; stop: () => Promise<void> } {
  const id = randomUUID();
  const base = { id, host: hostname(), pid: process.pid, ...who, started_at: new Date().toISOString() };
  let stopped = false;
  const beat = () => {
    if (stopped) return;
    const value: ProcessBeat = { ...base, ...now(), seen_at: new Date().toISOString() };
    // A beat is also the process's probe of Redis: a frozen server drops no connection, so only a
    // command that times out, and then one answered, tell an outage's start and end.
    void redis.set(keyOf(prefix, id), JSON.stringify(value), 'PX', TTL_MS).then(
      () => outage.ready(),
      (err: unknown) => outage.heard(err, 'heartbeat'),
    );
  };
  beat();
  const timer = setInterval(beat, HEARTBEAT_MS);
  timer.unref();
  return {
    beat,
    async stop() {
      stopped = true;
      clearInterval(timer);
      await redis.del(keyOf(prefix, id)).catch(() => undefined);
    },
  };
}

/** The service processes alive now (a beat that does not parse is left out). */
export async function liveProcesses(redis: Redis, prefix: string): Promise<ProcessBeat[]> {
  const keys: string[] = [];
  for await (const page of scanKeys(redis, keyOf(prefix, '*'))) keys.push(...page.keys);
  if (!keys.length) return [];
  const values = await redis.mget(...keys);
  return values.flatMap((v) => {
    if (!v) return [];
    try {
      const parsed = ProcessBeat.safeParse(JSON.parse(v));
      return parsed.success ? [parsed.data] : [];
    } catch {
      return [];
    }
  });
}

/** The live processes that consume `queue`. */
export const takingQueue = (beats: ProcessBeat[], queue: string): ProcessBeat[] => beats.filter((b) => b.queues.some((q) => q.queue === queue));

/** How a process is named to an operator. */
export const processName = (b: Pick<ProcessBeat, 'roles' | 'pid' | 'host'>): string => `${b.roles.join('+') || 'process'} pid ${b.pid} on ${b.host}`;
