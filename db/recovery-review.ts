import type { Knex } from 'knex';
import { newestFirstPage } from './knex';

/** What a password reset undid, for its owner to keep or remove (migration 028). */

export type ReviewKind = 'invitation' | 'team_link' | 'webhook' | 'member';
export type ReviewAction = 'revoked' | 'returned_to_pending' | 'paused' | 'demoted' | 'listed';
export type ReviewDecision = 'kept' | 'removed';

export interface ReviewItemRow {
  id: string;
  user_id: string;
  kind: ReviewKind;
  target_id: string;
  label: string;
  action: ReviewAction;
  details: Record<string, unknown>;
  created_at: Date;
  decision: ReviewDecision | null;
  decided_at: Date | null;
}

export type NewReviewItem = Pick<ReviewItemRow, 'kind' | 'target_id' | 'label' | 'action' | 'details'>;

const items = (db: Knex) => db<ReviewItemRow>('recovery_review_items');

/**
 * Lists what a reset undid; a thing that already has an open item keeps that one (the partial unique
 * index recovery_review_items_open). Answers the rows inserted.
 */
export async function insertReviewItems(trx: Knex.Transaction, userId: string, at: Date, rows: NewReviewItem[]): Promise<ReviewItemRow[]> {
  if (!rows.length) return [];
  return items(trx)
    .insert(rows.map((r) => ({ ...r, user_id: userId, created_at: at })))
    .onConflict()
    .ignore()
    .returning('*');
}

/** A page of the account's items, newest first: `open` ones (undecided), or those kept or removed. */
export async function pageReviewItems(
  db: Knex,
  userId: string,
  q: { state?: 'open' | ReviewDecision; page: number; pageSize: number },
): Promise<{ items: ReviewItemRow[]; total: number }> {
  const base = items(db).where({ user_id: userId });
  if (q.state === 'open') base.whereNull('decision');
  else if (q.state) base.where({ decision: q.state });
  return newestFirstPage<ReviewItemRow>(base, q);
}

export const findReviewItem = async (db: Knex, id: string): Promise<ReviewItemRow | undefined> => items(db).where({ id }).first();

/** The item, locked: two decisions on it take turns. */
export const lockReviewItem = async (trx: Knex.Transaction, id: string): Promise<ReviewItemRow | undefined> => items(trx).where({ id }).forUpdate().first();

export async function markReviewDecided(trx: Knex.Transaction, id: string, decision: ReviewDecision, at: Date): Promise<ReviewItemRow> {
  const [row] = await items(trx).where({ id }).update({ decision, decided_at: at }).returning('*');
  return row;
}
