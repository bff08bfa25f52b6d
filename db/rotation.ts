import type { Knex } from 'knex';
import { withWrites, type Write } from './knex';

export type RotationTrigger = 'manual' | 'schedule' | 'policy';

export interface RotationRow {
  id: string;
  user_id: string;
  lineage_id: string;
  old_fingerprint: string;
  new_fingerprint: string | null;
  from_generation: number;
  trigger: RotationTrigger;
  actor_id: string | null;
  status: 'succeeded' | 'failed';
  error: { code: string; message: string } | null;
  job_id: string | null;
  created_at: Date;
}

/** Inserts a history row; `alongside`, writes to other tables, in the same statement (db/knex.ts `withWrites`). */
export async function insertRotation(db: Knex, row: Omit<RotationRow, 'id' | 'created_at'>, alongside: Write[] = []): Promise<RotationRow> {
  const history = db('rotation_history');
  withWrites(history, alongside);
  const [inserted] = await history.insert({ ...row, error: row.error ? JSON.stringify(row.error) : null }).returning<RotationRow[]>('*');
  return inserted;
}

/** A history row's insert, to run beside another statement (db/knex.ts `withWrites`): its id and time come with it. */
export const rotationInsert = (db: Knex, row: RotationRow): Write =>
  db<object>('rotation_history').insert({ ...row, error: row.error ? JSON.stringify(row.error) : null });

export const succeededRotationFrom = async (db: Knex, lineageId: string, fromGeneration: number): Promise<RotationRow | undefined> =>
  db<RotationRow>('rotation_history').where({ lineage_id: lineageId, from_generation: fromGeneration, status: 'succeeded' }).first();

export interface RotationQuery {
  userId: string;
  lineageId?: string;
  from?: Date;
  to?: Date;
  trigger?: RotationTrigger;
  status?: RotationRow['status'];
  page: number;
  pageSize: number;
}

export async function listRotations(db: Knex, q: RotationQuery): Promise<{ items: RotationRow[]; total: number }> {
  const base = db<RotationRow>('rotation_history').where({ user_id: q.userId });
  if (q.lineageId) base.andWhere({ lineage_id: q.lineageId });
  if (q.from) base.andWhere('created_at', '>=', q.from);
  if (q.to) base.andWhere('created_at', '<', q.to);
  if (q.trigger) base.andWhere({ trigger: q.trigger });
  if (q.status) base.andWhere({ status: q.status });
  const [items, count] = await Promise.all([
    base
      .clone()
      .orderBy([
        { column: 'created_at', order: 'desc' },
        { column: 'from_generation', order: 'desc' },
      ])
      .limit(q.pageSize)
      .offset((q.page - 1) * q.pageSize),
    base.clone().count<{ count: number }[]>({ count: '*' }),
  ]);
  return { items, total: count[0]?.count ?? 0 };
}

export interface DueRotation {
  lineage_id: string;
  user_id: string;
  generation: number;
  trigger: 'schedule' | 'policy';
}

/**
 * Lineages whose current generation is older than their interval: the key's own ('schedule') or the
 * account's rotation_days ('policy'). Disabled keys, recipient keys (no private key of ours to replace)
 * and deleted accounts are never due.
 */
export async function dueRotations(db: Knex, now: Date, limit: number): Promise<DueRotation[]> {
  return db
    .select('l.id as lineage_id', 'l.user_id', 'k.generation', db.raw(`CASE WHEN l.rotation_mode = 'interval' THEN 'schedule' ELSE 'policy' END AS trigger`))
    .from('key_lineages as l')
    .join('pgp_keys as k', function () {
      this.on('k.lineage_id', '=', 'l.id').andOnVal('k.status', '=', 'active');
    })
    .join('users as u', 'u.id', 'l.user_id')
    .whereNull('l.disabled_at')
    .where('l.kind', 'managed')
    .whereNull('u.deleted_at')
    .whereRaw(
      `k.created_at + make_interval(days => CASE l.rotation_mode WHEN 'interval' THEN l.rotation_interval_days WHEN 'policy' THEN u.rotation_days END) <= ?`,
      [now],
    )
    .orderBy('k.created_at')
    .limit(limit);
}
