import type { Knex } from 'knex';
import { grantedLineageIds } from './teams';

export interface LineageRow {
  id: string;
  user_id: string;
  label: string;
  environment: string;
  uid_name: string;
  uid_email: string;
  algorithm: string;
  unlock_public: string;
  unlock_locked: string;
  unlock_mac: string | null;
  key_ttl_days: number | null;
  disabled_at: Date | null;
  rotation_mode: 'policy' | 'interval' | 'off';
  rotation_interval_days: number | null;
  created_at: Date;
  updated_at: Date;
}

export interface KeyRow {
  id: string;
  lineage_id: string;
  user_id: string;
  generation: number;
  fingerprint: string;
  encryption_key_ids: string[];
  algorithm: string;
  public_armored: string;
  public_mac: string | null;
  private_sealed: string;
  secret_sealed: string;
  status: 'active' | 'rotated';
  expires_at: Date | null;
  rotated_at: Date | null;
  ops_count: number;
  bytes_count: number;
  last_used_at: Date | null;
  expiry_warned_at: Date | null;
  created_at: Date;
}

/** A lineage with its current generation: what the API calls "a key". */
export interface KeyView {
  lineage: LineageRow;
  current: KeyRow;
  /** The generation the caller named (may be an older, rotated one). */
  named: KeyRow;
  /** Reached through team access (another account's lineage granted to the caller), not owned. */
  inherited?: boolean;
}

/**
 * The one ownership predicate on `pgp_keys` rows (alias `alias`): the caller's own keys, and with
 * `inherited` the lineages team access grants it (db/teams.ts grantedLineageIds).
 */
export function usableBy(db: Knex, userId: string, opts: { inherited?: boolean; alias?: string } = {}) {
  const col = (name: string) => (opts.alias ? `${opts.alias}.${name}` : name);
  return (w: Knex.QueryBuilder) => {
    w.where(col('user_id'), userId);
    if (opts.inherited) w.orWhereIn(col('lineage_id'), grantedLineageIds(db, userId));
  };
}

export async function insertLineage(db: Knex, row: Omit<LineageRow, 'created_at' | 'updated_at' | 'disabled_at' | 'rotation_mode' | 'rotation_interval_days'>): Promise<LineageRow> {
  const [inserted] = await db<LineageRow>('key_lineages').insert(row).returning('*');
  return inserted!;
}

export async function insertKey(db: Knex, row: Omit<KeyRow, 'id' | 'status' | 'rotated_at' | 'ops_count' | 'bytes_count' | 'last_used_at' | 'expiry_warned_at' | 'created_at'>): Promise<KeyRow> {
  const [inserted] = await db<KeyRow>('pgp_keys').insert(row).returning('*');
  return inserted!;
}

/**
 * Resolves any generation's fingerprint to its lineage and current generation, within one account:
 * another account's fingerprint is simply not found.
 */
export async function findKeyByFingerprint(db: Knex, userId: string, fingerprint: string, opts: { inherited?: boolean } = {}): Promise<KeyView | undefined> {
  const named = await db<KeyRow>('pgp_keys').where({ fingerprint: fingerprint.toLowerCase() }).andWhere(usableBy(db, userId, opts)).first();
  if (!named) return undefined;
  const [lineage, current] = await Promise.all([
    db<LineageRow>('key_lineages').where({ id: named.lineage_id }).first(),
    db<KeyRow>('pgp_keys').where({ lineage_id: named.lineage_id, status: 'active' }).first(),
  ]);
  return lineage && current ? { lineage, current, named, inherited: named.user_id !== userId } : undefined;
}

/** A job's re-check at run time: the generation it names is still the caller's own or granted to it. */
export const findUsableKey = (db: Knex, userId: string, where: { id: string; fingerprint: string }) =>
  db<KeyRow>('pgp_keys').where(where).andWhere(usableBy(db, userId, { inherited: true })).first();

/** Whether the caller may still use a lineage (its own, or granted): decrypt jobs re-check it. */
export const lineageUsableBy = async (db: Knex, userId: string, lineageId: string) =>
  Boolean(await db<LineageRow>('key_lineages').where({ id: lineageId }).andWhere((w) => w.where({ user_id: userId }).orWhereIn('id', grantedLineageIds(db, userId))).first());

export const lineageGenerations = (db: Knex, lineageId: string) => db<KeyRow>('pgp_keys').where({ lineage_id: lineageId }).orderBy('generation', 'desc');

export interface KeyListQuery {
  userId: string;
  environment?: string;
  label?: string;
  active?: boolean;
  /** Include the lineages team access grants the caller. */
  inherited?: boolean;
  now: Date;
  page: number;
  pageSize: number;
}

export async function listKeys(db: Knex, q: KeyListQuery): Promise<{ items: { lineage: LineageRow; current: KeyRow }[]; total: number }> {
  const base = db('key_lineages as l').join('pgp_keys as k', function () {
    this.on('k.lineage_id', '=', 'l.id').andOnVal('k.status', '=', 'active');
  }).where(usableBy(db, q.userId, { inherited: q.inherited, alias: 'k' }));
  if (q.environment) base.andWhere('l.environment', q.environment);
  if (q.label) base.andWhere('l.label', q.label);
  if (q.active === true) base.whereNull('l.disabled_at').andWhere((w) => w.whereNull('k.expires_at').orWhere('k.expires_at', '>', q.now));
  if (q.active === false) base.andWhere((w) => w.whereNotNull('l.disabled_at').orWhere('k.expires_at', '<=', q.now));
  const [rows, count] = await Promise.all([
    base.clone().select('l.id as lineage_id', 'k.id as key_id').orderBy('l.created_at', 'desc').orderBy('l.id').limit(q.pageSize).offset((q.page - 1) * q.pageSize),
    base.clone().count<{ count: number }[]>({ count: '*' }),
  ]);
  const ids = rows as { lineage_id: string; key_id: string }[];
  const [lineages, keys] = await Promise.all([
    db<LineageRow>('key_lineages').whereIn('id', ids.map((r) => r.lineage_id)),
    db<KeyRow>('pgp_keys').whereIn('id', ids.map((r) => r.key_id)),
  ]);
  const items = ids.map((r) => ({ lineage: lineages.find((l) => l.id === r.lineage_id)!, current: keys.find((k) => k.id === r.key_id)! }));
  return { items, total: count[0]?.count ?? 0 };
}

/** Usage counters, bumped in the transaction that completes the job which used the key. */
export const recordKeyUse = (db: Knex, keyId: string, bytes: number, at: Date) =>
  db('pgp_keys').where({ id: keyId }).update({ ops_count: db.raw('ops_count + 1'), bytes_count: db.raw('bytes_count + ?', [bytes]), last_used_at: at });
