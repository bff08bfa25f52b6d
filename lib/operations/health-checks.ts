import type { Container } from '../container';
import { pingDb } from '../../db/knex';
import { resealProgress } from '../root-of-trust/operations';
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

/** The latest re-seal of the keyring, for the status snapshot. */
export const latestReseal = (c: Container) => resealProgress(c.db);
