import type { Container } from '../container';
import { pingDb } from '../../db/knex';
import { currentDataKey, processKeyrings, resealProgress, type ProcessKeyring } from '../root-of-trust/operations';
import type { ProcessBeat } from '../heartbeats';
import { within } from '../within';

/** Each dependency gets this long to answer a health check. */
export const CHECK_MS = 2000;

/** A round trip to Postgres (readiness, status latency). */
export const pingPostgres = async (c: Container): Promise<void> => {
  await pingDb(c.db);
};

/** Whether Postgres and Redis each answer within CHECK_MS: the readiness of an API or a worker process. */
export async function dependencyChecks(c: Container): Promise<{ postgres: 'up' | 'down'; redis: 'up' | 'down' }> {
  const check = (work: Promise<unknown>) =>
    within(work, CHECK_MS).then(
      () => 'up' as const,
      () => 'down' as const,
    );
  const [postgres, redis] = await Promise.all([check(pingPostgres(c)), check(c.redis.ping())]);
  return { postgres, redis };
}

/**
 * Whether this process's latest keyring reload succeeded: `stale` while it fails (a root key it was not
 * given, Postgres out of reach), when it may keep sealing under a data key that is no longer current.
 * It still serves (what it seals, every process opens), so this degrades readiness without failing it;
 * `master-key retire` refuses meanwhile.
 */
export const keyringCheck = (c: Container): 'current' | 'stale' => (c.keyring.state().reload_error === null ? 'current' : 'stale');

/** The latest re-seal of the keyring, for the status snapshot. */
export const latestReseal = (c: Container) => resealProgress(c.db);

/** Each live process with the data key it seals under, and whether that is the keyring's current one. */
export async function keyringOfProcesses(c: Container, beats: ProcessBeat[]): Promise<ProcessKeyring[]> {
  return processKeyrings(beats, await currentDataKey(c.db));
}
