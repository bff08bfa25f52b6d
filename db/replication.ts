import { prepared, type Db } from './knex';

/** LSNs as byte positions in the WAL (`pg_lsn - '0/0'`), which compare as numbers. */
const currentLsn = prepared<{ lsn: string }>('current_wal_lsn', "SELECT CAST(pg_current_wal_lsn() - CAST('0/0' AS pg_lsn) AS text) AS lsn");

/** The primary's WAL position now: every transaction committed before this call lies below it. */
export async function currentWalLsn(db: Db): Promise<bigint> {
  const [row] = await currentLsn(db, {});
  return BigInt(row.lsn);
}

export interface ReplayPosition {
  /** How far the standby has replayed the primary's WAL; null on a server that is not in recovery. */
  replayed: bigint | null;
  /**
   * Seconds since the commit it replayed last was made on the primary (`now() - pg_last_xact_replay_timestamp()`);
   * null before it has replayed one. On a primary with no commits, this grows as well.
   */
  lagSeconds: number | null;
}

/** A standby's replay position, in one statement. */
export async function replayPosition(db: Db): Promise<ReplayPosition> {
  const { rows } = await db.raw<{ rows: { replayed: string | null; lag: number | null }[] }>(
    `SELECT CAST(pg_last_wal_replay_lsn() - CAST('0/0' AS pg_lsn) AS text) AS replayed,
            CAST(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()) AS float8) AS lag`,
  );
  const row = rows[0];
  return { replayed: row.replayed === null ? null : BigInt(row.replayed), lagSeconds: row.lag };
}
