import type { Knex } from 'knex';
import type { Write } from './knex';

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

/** Takes the account's relay lock for the transaction, if it is free: one relayer per account keeps its events in order. */
export async function lockAccountOutbox(trx: Knex.Transaction, userId: string): Promise<boolean> {
  const { rows } = await trx.raw<{ rows: { locked: boolean }[] }>(`SELECT pg_try_advisory_xact_lock(hashtextextended('event_outbox:' || ?, 0)) AS locked`, [
    userId,
  ]);
  return rows[0].locked;
}

export const pendingEvents = async (db: Knex, userId: string, limit: number): Promise<OutboxRow[]> =>
  db('event_outbox').where({ user_id: userId }).orderBy('id').limit(limit);

export async function deleteOutbox(db: Knex, ids: string[]): Promise<void> {
  if (ids.length) await db('event_outbox').whereIn('id', ids).delete();
}

/** Accounts with events still to publish. */
export async function accountsWithPendingEvents(db: Knex, limit: number): Promise<string[]> {
  const rows = await db<OutboxRow>('event_outbox').distinct('user_id').limit(limit);
  return rows.map((r) => r.user_id);
}
