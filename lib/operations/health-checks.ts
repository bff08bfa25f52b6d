import type { Container } from '../container';
import { pingDb } from '../../db/knex';
import { resealProgress } from '../root-of-trust/operations';

/** A round trip to Postgres (readiness, status latency). */
export const pingPostgres = async (c: Container): Promise<void> => {
  await pingDb(c.db);
};

/** The latest re-seal of the keyring, for the status snapshot. */
export const latestReseal = (c: Container) => resealProgress(c.db);
