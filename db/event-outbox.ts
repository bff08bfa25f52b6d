import type { Knex } from 'knex';
import { columnsOf, prepared, type Write } from './knex';

export interface OutboxRow {
  id: string;
  user_id: string;
  type: string;
  data: Record<string, unknown>;
  once_key: string | null;
  once_seconds: number | null;
  created_at: Date;
}

export type NewOutboxRow = Omit<OutboxRow, 'id'>;

/** Stores events to publish; a row whose `once_key` is already waiting is not stored twice. */
export async function insertOutbox(db: Knex, rows: NewOutboxRow[]): Promise<void> {
  if (rows.length) await outboxInsert(db, rows);
}

/** The insert of insertOutbox as a statement to run in a transaction or beside another write (db/knex.ts withWrites). */
export const outboxInsert = (db: Knex, rows: NewOutboxRow[]): Write => db<object>('event_outbox').insert(rows).onConflict('once_key').ignore();

/**
 * Takes the account's relay lock for the transaction, if it is free (one relayer per account keeps its
 * events in order), and with it, in the same statement, the account's oldest `limit` events, deleted: a
 * relayer that cannot publish them rolls the transaction back and they wait again. Undefined: another
 * transaction holds the lock. Rows a relayer committed meanwhile are not returned: Postgres re-checks a
 * deleted row before deleting it again.
 */
export async function takePendingEvents(trx: Knex.Transaction, userId: string, limit: number): Promise<OutboxRow[] | undefined> {
  const rows = await takePending(trx, { user_id: userId, limit });
  if (!rows[0].locked) return undefined;
  return rows.filter((r): r is { locked: boolean } & OutboxRow => r.id !== null).map(({ locked: _, ...row }) => row);
}
const OUTBOX_COLUMNS = columnsOf<OutboxRow>({ id: 1, user_id: 1, type: 1, data: 1, once_key: 1, once_seconds: 1, created_at: 1 });
const takePending = prepared<{ locked: boolean } & (OutboxRow | { [K in keyof OutboxRow]: null })>(
  'take_pending_events',
  `WITH lock AS MATERIALIZED (SELECT pg_try_advisory_xact_lock(hashtextextended('event_outbox:' || CAST(:user_id AS text), 0)) AS locked),
   taken AS (
     DELETE FROM event_outbox WHERE id IN (
       SELECT id FROM event_outbox WHERE user_id = :user_id AND (SELECT locked FROM lock) ORDER BY id LIMIT :limit
     ) RETURNING ${OUTBOX_COLUMNS.join(', ')}
   )
   SELECT lock.locked, ${OUTBOX_COLUMNS.map((c) => `taken.${c}`).join(', ')} FROM lock LEFT JOIN taken ON true ORDER BY taken.id`,
);

/** Accounts with events still to publish. */
export async function accountsWithPendingEvents(db: Knex, limit: number): Promise<string[]> {
  const rows = await db<OutboxRow>('event_outbox').distinct('user_id').limit(limit);
  return rows.map((r) => r.user_id);
}
