import type { Knex } from 'knex';
import { columnsOf, prepared, type Write } from './knex';
import type { KeyProfile } from '../lib/pgp/profiles';

export type LineageKind = 'managed' | 'recipient';

export interface LineageRow {
  id: string;
  user_id: string;
  label: string;
  environment: string;
  uid_name: string;
  uid_email: string;
  /** The algorithm and OpenPGP profile (lib/pgp/profiles.ts) its next generation is made with. */
  algorithm: string;
  profile: KeyProfile;
  /** `recipient`: an imported public key (encrypts and verifies only); its unlock columns are ''. */
  kind: LineageKind;
  unlock_public: string;
  unlock_locked: string;
  unlock_mac: string | null;
  key_ttl_days: number | null;
  disabled_at: Date | null;
  rotation_mode: 'policy' | 'interval' | 'off';
  rotation_interval_days: number | null;
  /** Generations below this no longer decrypt or rewrap; 1 retires nothing. */
  min_decryption_generation: number;
  /** Whole-key destruction: when it is due, and when it was done. */
  destroy_after: Date | null;
  destroyed_at: Date | null;
  /** Its generations' private keys are sealed under its own key in the token (LINEAGE_TOKEN_KEYS, lib/root-of-trust/lineage-keys.ts). */
  token_key: boolean;
  /** When that key was deleted from the token (its last generation destroyed). */
  token_key_deleted_at: Date | null;
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
  /** The OpenPGP profile its key was made or imported under (v4 `rfc4880`, v6 `rfc9580` or `pqc`). */
  profile: KeyProfile;
  public_armored: string;
  public_mac: string | null;
  /** Brought in through /keys/import rather than generated here. */
  imported: boolean;
  /** Both '' once the generation is destroyed (crypto-shredded; `destroyed_at` says so). */
  private_sealed: string;
  secret_sealed: string;
  status: 'active' | 'rotated';
  expires_at: Date | null;
  rotated_at: Date | null;
  ops_count: number;
  bytes_count: number;
  last_used_at: Date | null;
  expiry_warned_at: Date | null;
  destroy_after: Date | null;
  destroyed_at: Date | null;
  encrypt_files: number;
  encrypt_bytes: number;
  decrypt_files: number;
  decrypt_bytes: number;
  last_decrypt_at: Date | null;
  rewrap_from_files: number;
  rewrap_to_files: number;
  created_at: Date;
}

/** Columns a new generation row leaves to their defaults. */
type KeyDefaults =
  | 'id'
  | 'imported'
  | 'status'
  | 'rotated_at'
  | 'ops_count'
  | 'bytes_count'
  | 'last_used_at'
  | 'expiry_warned_at'
  | 'created_at'
  | 'destroy_after'
  | 'destroyed_at'
  | 'encrypt_files'
  | 'encrypt_bytes'
  | 'decrypt_files'
  | 'decrypt_bytes'
  | 'last_decrypt_at'
  | 'rewrap_from_files'
  | 'rewrap_to_files';

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
 * The one ownership predicate, in SQL for the prepared statements that check it: a row (a generation, or
 * a lineage) whose owner column is `:user`, or, with `:inherited`, whose lineage team access grants it
 * (db/teams.ts grantedLineageIds, migration 016). The grants are an array computed once (an InitPlan,
 * skipped when every row is the caller's own), so that Postgres can look both sides up in indexes: as
 * `IN (subquery)` the list scanned every current generation of every account (12.9 against 0.8 ms a
 * list with 20,000 keys).
 */
const usableSql = (owner: string, lineage: string) =>
  `(${owner} = :user OR ${lineage} = ANY (ARRAY(SELECT g FROM granted_lineage_ids(:user) g WHERE :inherited)))`;

export async function insertLineage(
  db: Knex,
  row: Omit<
    LineageRow,
    | 'kind'
    | 'created_at'
    | 'updated_at'
    | 'disabled_at'
    | 'rotation_mode'
    | 'rotation_interval_days'
    | 'min_decryption_generation'
    | 'destroy_after'
    | 'destroyed_at'
    | 'token_key'
    | 'token_key_deleted_at'
  > &
    Partial<Pick<LineageRow, 'kind' | 'token_key'>>,
): Promise<LineageRow> {
  const [inserted] = await db<LineageRow>('key_lineages').insert(row).returning('*');
  return inserted;
}

export async function insertKey(db: Knex, row: Omit<KeyRow, KeyDefaults> & Partial<Pick<KeyRow, 'imported'>>): Promise<KeyRow> {
  const [inserted] = await db<KeyRow>('pgp_keys').insert(row).returning('*');
  return inserted;
}

/**
 * Resolves any generation's fingerprint to its lineage and current generation, within one account (and,
 * with `inherited`, the lineages team access grants it): another account's copy of the fingerprint is
 * simply not found. A fingerprint is unique within an account only, so the caller's own key and a granted
 * one may both match: `needsPrivate` (decrypt, sign) puts a key that holds its private key first, then the
 * caller's own key comes before a granted one, then the older.
 */
export async function findKeyByFingerprint(
  db: Knex,
  userId: string,
  fingerprint: string,
  opts: { inherited?: boolean; needsPrivate?: boolean } = {},
): Promise<KeyView | undefined> {
  const [row] = await keyByFingerprint(db, {
    fingerprint: fingerprint.toLowerCase(),
    user: userId,
    inherited: opts.inherited ?? false,
    private: opts.needsPrivate ?? false,
  });
  if (!row) return undefined;
  const lineage = Object.fromEntries(LINEAGE_COLUMNS.map((col) => [col, row[LINEAGE_AS + col]])) as unknown as LineageRow;
  const named = Object.fromEntries(KEY_COLUMNS.map((col) => [col, row[col]])) as unknown as KeyRow;
  const current =
    named.status === 'active'
      ? named
      : row[CURRENT_AS + 'id']
        ? (Object.fromEntries(KEY_COLUMNS.map((col) => [col, row[CURRENT_AS + col]])) as unknown as KeyRow)
        : undefined;
  return current ? { lineage, current, named, inherited: named.user_id !== userId } : undefined;
}

/** Every column of `key_lineages` and of `pgp_keys`, for the statements that name them (db/knex.ts prepared). */
const LINEAGE_COLUMNS = columnsOf<LineageRow>({
  id: 1,
  user_id: 1,
  label: 1,
  environment: 1,
  uid_name: 1,
  uid_email: 1,
  algorithm: 1,
  profile: 1,
  kind: 1,
  unlock_public: 1,
  unlock_locked: 1,
  unlock_mac: 1,
  key_ttl_days: 1,
  disabled_at: 1,
  rotation_mode: 1,
  rotation_interval_days: 1,
  min_decryption_generation: 1,
  destroy_after: 1,
  destroyed_at: 1,
  token_key: 1,
  token_key_deleted_at: 1,
  created_at: 1,
  updated_at: 1,
});
const KEY_COLUMNS = columnsOf<KeyRow>({
  id: 1,
  lineage_id: 1,
  user_id: 1,
  generation: 1,
  fingerprint: 1,
  encryption_key_ids: 1,
  algorithm: 1,
  profile: 1,
  public_armored: 1,
  public_mac: 1,
  imported: 1,
  private_sealed: 1,
  secret_sealed: 1,
  status: 1,
  expires_at: 1,
  rotated_at: 1,
  ops_count: 1,
  bytes_count: 1,
  last_used_at: 1,
  expiry_warned_at: 1,
  destroy_after: 1,
  destroyed_at: 1,
  encrypt_files: 1,
  encrypt_bytes: 1,
  decrypt_files: 1,
  decrypt_bytes: 1,
  last_decrypt_at: 1,
  rewrap_from_files: 1,
  rewrap_to_files: 1,
  created_at: 1,
});
const LINEAGE_AS = 'lineage__';

const CURRENT_AS = 'current__';

// The generation, its lineage and, when the named one is not it, the lineage's current generation, in one
// query: the lineage's columns come under LINEAGE_AS names, the current generation's under CURRENT_AS.
const keyByFingerprint = prepared<Record<string, unknown>>(
  'key_by_fingerprint',
  `SELECT ${KEY_COLUMNS.map((c) => `k.${c}`).join(', ')}, ${LINEAGE_COLUMNS.map((c) => `l.${c} AS ${LINEAGE_AS}${c}`).join(', ')},
     ${KEY_COLUMNS.map((c) => `a.${c} AS ${CURRENT_AS}${c}`).join(', ')}
   FROM pgp_keys k JOIN key_lineages l ON l.id = k.lineage_id
   LEFT JOIN pgp_keys a ON a.lineage_id = k.lineage_id AND a.status = 'active' AND k.status <> 'active'
   WHERE k.fingerprint = :fingerprint AND ${usableSql('k.user_id', 'k.lineage_id')}
   ORDER BY (CAST(:private AS boolean) AND l.kind = 'recipient'), k.user_id = :user DESC, k.created_at, k.id
   LIMIT 1`,
);

/**
 * Lineages whose token key is still to delete: every generation destroyed, the object not yet deleted
 * (the sweep deletes it after the commit that destroyed the last one, and again after a failed delete).
 */
export const lineagesWithSpentTokenKey = async (db: Knex, limit: number): Promise<Pick<LineageRow, 'id' | 'user_id'>[]> =>
  db<LineageRow>('key_lineages as l')
    .where('l.token_key', true)
    .whereNull('l.token_key_deleted_at')
    .whereNotExists(db('pgp_keys as k').whereRaw('k.lineage_id = l.id').whereNull('k.destroyed_at'))
    .select<Pick<LineageRow, 'id' | 'user_id'>[]>('l.id', 'l.user_id')
    .limit(limit);

/** Whether a lineage's generations use its token key, read under its row lock (false when it is gone). */
export const lockedTokenKey = async (trx: Knex.Transaction, lineageId: string): Promise<boolean> =>
  Boolean((await trx<LineageRow>('key_lineages').where({ id: lineageId }).forUpdate().first('token_key'))?.token_key);

/** Records the deletion of a lineage's token key, once. */
export const markTokenKeyDeleted = async (db: Knex, lineageId: string, at: Date): Promise<number> =>
  db('key_lineages').where({ id: lineageId, token_key: true }).whereNull('token_key_deleted_at').update({ token_key_deleted_at: at });

/** A generation's identity: what a rotation needs of the one it replaces. */
export type GenerationRef = Pick<KeyRow, 'id' | 'fingerprint' | 'generation'>;

const withActive = prepared<LineageRow & { active_id: string; active_fingerprint: string; active_generation: number }>(
  'lineage_with_active',
  `SELECT ${LINEAGE_COLUMNS.map((c) => `l.${c}`).join(', ')}, k.id AS active_id, k.fingerprint AS active_fingerprint, k.generation AS active_generation
   FROM key_lineages l JOIN pgp_keys k ON k.lineage_id = l.id AND k.status = 'active'
   WHERE l.id = :id`,
);

/** A lineage with its active generation, in one query. */
export async function lineageWithActive(db: Knex, lineageId: string): Promise<{ lineage: LineageRow; active: GenerationRef } | undefined> {
  const [row] = await withActive(db, { id: lineageId });
  if (!row) return undefined;
  const { active_id, active_fingerprint, active_generation, ...lineage } = row;
  return { lineage, active: { id: active_id, fingerprint: active_fingerprint, generation: active_generation } };
}

/**
 * A rotation's compare-and-swap: retires the lineage's active generation if it is still `generation`,
 * under the lineage's row lock (taken in the same statement and held by the caller's transaction).
 * False when the lineage is gone or another rotation got there first.
 */
const retire = prepared<{ id: string }>(
  'retire_active',
  `WITH locked AS (SELECT id FROM key_lineages WHERE id = :lineage FOR UPDATE)
   UPDATE pgp_keys SET status = 'rotated', rotated_at = :at FROM locked
   WHERE pgp_keys.lineage_id = :lineage AND pgp_keys.status = 'active' AND pgp_keys.generation = :generation
   RETURNING pgp_keys.id`,
);
export async function retireActive(db: Knex, lineageId: string, generation: number, at: Date): Promise<boolean> {
  return (await retire(db, { lineage: lineageId, generation, at })).length === 1;
}

/** A job's re-check at run time: the generation it names is still the caller's own or granted to it. */
const usableKey = prepared<KeyRow>(
  'usable_key',
  `SELECT ${KEY_COLUMNS.join(', ')} FROM pgp_keys k WHERE id = :id AND fingerprint = :fingerprint AND ${usableSql('k.user_id', 'k.lineage_id')}`,
);
export const findUsableKey = async (db: Knex, userId: string, where: { id: string; fingerprint: string }): Promise<KeyRow | undefined> =>
  (await usableKey(db, { ...where, user: userId, inherited: true }))[0];

/** Whether the caller may still use a lineage (its own, or granted): decrypt jobs re-check it. */
const usableLineage = prepared<{ id: string }>('usable_lineage', `SELECT id FROM key_lineages l WHERE id = :id AND ${usableSql('l.user_id', 'l.id')}`);
export const lineageUsableBy = async (db: Knex, userId: string, lineageId: string): Promise<boolean> =>
  (await usableLineage(db, { id: lineageId, user: userId, inherited: true })).length > 0;

export const lineageGenerations = async (db: Knex, lineageId: string): Promise<KeyRow[]> =>
  db<KeyRow>('pgp_keys').where({ lineage_id: lineageId }).orderBy('generation', 'desc');

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

/** What a key list shows of each lineage and its current generation (never the key material). */
const LISTED_LINEAGE = [
  'id',
  'user_id',
  'label',
  'environment',
  'uid_name',
  'uid_email',
  'profile',
  'kind',
  'created_at',
  'disabled_at',
  'rotation_mode',
  'rotation_interval_days',
] as const;
const LISTED_KEY = ['fingerprint', 'algorithm', 'profile', 'generation', 'imported', 'created_at', 'expires_at'] as const;
export type ListedKey = { lineage: Pick<LineageRow, (typeof LISTED_LINEAGE)[number]>; current: Pick<KeyRow, (typeof LISTED_KEY)[number]> };

/**
 * A page of keys and the total, one prepared statement (every filter a parameter: NULL leaves it out).
 * Ownership is checked on the lineage (a generation belongs to its lineage's owner), whose account index
 * finds the caller's rows. `active` is the complement of "disabled or expired" (expires_at > now when it has one).
 */
const listPage = prepared<Record<string, unknown> & { list_total: number }>(
  'list_keys',
  `SELECT ${LISTED_LINEAGE.map((c) => `l.${c} AS l_${c}`).join(', ')}, ${LISTED_KEY.map((c) => `k.${c} AS k_${c}`).join(', ')}, count(*) OVER () AS list_total
   FROM key_lineages l JOIN pgp_keys k ON k.lineage_id = l.id AND k.status = 'active'
   WHERE ${usableSql('l.user_id', 'l.id')}
     AND (CAST(:environment AS text) IS NULL OR l.environment = :environment)
     AND (CAST(:label AS text) IS NULL OR l.label = :label)
     AND (CAST(:active AS boolean) IS NULL OR :active = (l.disabled_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > :now)))
   ORDER BY l.created_at DESC, l.id
   LIMIT :limit OFFSET :offset`,
);

export async function listKeys(db: Knex, q: KeyListQuery): Promise<{ items: ListedKey[]; total: number }> {
  const filters = {
    user: q.userId,
    inherited: q.inherited ?? false,
    environment: q.environment ?? null,
    label: q.label ?? null,
    active: q.active ?? null,
    now: q.now,
  };
  const rows = await listPage(db, { ...filters, limit: q.pageSize, offset: (q.page - 1) * q.pageSize });
  // A page past the end has no row to carry the total: only then is it counted on its own (from the first page).
  const total = rows.length ? rows[0].list_total : q.page > 1 ? ((await listPage(db, { ...filters, limit: 1, offset: 0 }))[0]?.list_total ?? 0) : 0;
  const pick = (row: Record<string, unknown>, prefix: string, columns: readonly string[]) => Object.fromEntries(columns.map((c) => [c, row[`${prefix}${c}`]]));
  const items = rows.map((row) => ({
    lineage: pick(row, 'l_', LISTED_LINEAGE) as ListedKey['lineage'],
    current: pick(row, 'k_', LISTED_KEY) as ListedKey['current'],
  }));
  return { items, total };
}

type GenerationUse = 'encrypt' | 'decrypt' | 'rewrap_from' | 'rewrap_to';

/** The per-generation usage columns that one job's `files`/`bytes` add to. */
function generationCounters(db: Knex, use: GenerationUse, files: number, bytes: number, at: Date): Record<string, unknown> {
  const add = (col: string, n: number) => db.raw('?? + ?', [col, n]);
  if (use === 'encrypt') return { encrypt_files: add('encrypt_files', files), encrypt_bytes: add('encrypt_bytes', bytes) };
  if (use === 'decrypt') return { decrypt_files: add('decrypt_files', files), decrypt_bytes: add('decrypt_bytes', bytes), last_decrypt_at: at };
  return use === 'rewrap_from' ? { rewrap_from_files: add('rewrap_from_files', files) } : { rewrap_to_files: add('rewrap_to_files', files) };
}

/** A job's use of a key, in the transaction that completes it: the key's counters and its generation's, one statement. */
export const recordKeyUse = (db: Knex, keyId: string, use: 'encrypt' | 'decrypt', files: number, bytes: number, at: Date): Write =>
  db<object>('pgp_keys')
    .where({ id: keyId })
    .update({
      ops_count: db.raw('ops_count + 1'),
      bytes_count: db.raw('bytes_count + ?', [bytes]),
      last_used_at: at,
      ...generationCounters(db, use, files, bytes, at),
    });

/** Per-generation usage alone (a rewrap's, which is not counted as a use of the key). */
export const recordGenerationUse = async (db: Knex, keyId: string, use: GenerationUse, files: number, bytes: number, at: Date): Promise<void> => {
  await db('pgp_keys')
    .where({ id: keyId })
    .update(generationCounters(db, use, files, bytes, at));
};

export interface ExpiryCandidate {
  key_id: string;
  lineage_id: string;
  user_id: string;
  fingerprint: string;
  label: string;
  email: string;
  expires_at: Date;
}

/**
 * Current generations of enabled keys expiring within the largest of `leadDays` whose nearest due
 * warning (the smallest lead time that has come) has not been sent: no key_expiry_warnings row with a
 * lead at or below it.
 */
export async function dueExpiryWarnings(db: Knex, now: Date, leadDays: number[], limit: number): Promise<ExpiryCandidate[]> {
  const maxLeadDays = Math.max(...leadDays);
  return db
    .select('k.id as key_id', 'k.lineage_id', 'k.user_id', 'k.fingerprint', 'l.label', 'u.email', 'k.expires_at')
    .from('pgp_keys as k')
    .join('key_lineages as l', 'l.id', 'k.lineage_id')
    .join('users as u', 'u.id', 'k.user_id')
    .where('k.status', 'active')
    .whereNull('l.disabled_at')
    .whereNull('u.deleted_at')
    .whereNotNull('k.expires_at')
    .where('k.expires_at', '<=', new Date(now.getTime() + maxLeadDays * 86_400_000))
    .whereNotExists(
      db('key_expiry_warnings as w')
        .whereRaw('w.key_id = k.id')
        .andWhereRaw("w.lead_days <= (SELECT min(l) FROM unnest(?::int[]) AS l WHERE k.expires_at <= ?::timestamptz + l * interval '1 day')", [leadDays, now]),
    )
    .orderBy('k.expires_at')
    .limit(limit);
}

/**
 * Claims the warnings `leadDays` of a generation (a key_expiry_warnings row each; a racing sweep's claim
 * wins). True when `nearest` was claimed here: the generation is then marked warned.
 */
export async function claimExpiryWarnings(trx: Knex.Transaction, keyId: string, leadDays: number[], nearest: number, now: Date): Promise<boolean> {
  const rows: { lead_days: number }[] = await trx('key_expiry_warnings')
    .insert(leadDays.map((lead_days) => ({ key_id: keyId, lead_days, sent_at: now })))
    .onConflict(['key_id', 'lead_days'])
    .ignore()
    .returning('lead_days');
  if (!rows.some((r) => r.lead_days === nearest)) return false;
  await trx('pgp_keys').where({ id: keyId }).whereNull('expiry_warned_at').update({ expiry_warned_at: now });
  return true;
}

/** The lineage and all its generations (oldest first), locked for the rest of the transaction. */
export async function lockLineageWithGenerations(trx: Knex.Transaction, lineageId: string): Promise<{ lineage: LineageRow; generations: KeyRow[] }> {
  const lineage = (await trx<LineageRow>('key_lineages').where({ id: lineageId }).forUpdate().first())!;
  const generations = await trx<KeyRow>('pgp_keys').where({ lineage_id: lineageId }).orderBy('generation').forUpdate();
  return { lineage, generations };
}

/** Changes a lineage's row and answers it as changed. */
export async function updateLineage(db: Knex, lineageId: string, patch: Partial<Omit<LineageRow, 'id' | 'user_id'>>): Promise<LineageRow> {
  const [row] = await db<LineageRow>('key_lineages').where({ id: lineageId }).update(patch).returning('*');
  return row;
}

/** Disables a lineage unless it is disabled already: the changed row, or undefined when it was. */
export async function disableLineage(db: Knex, lineageId: string, at: Date): Promise<LineageRow | undefined> {
  const [row] = await db<LineageRow>('key_lineages')
    .where({ id: lineageId })
    .whereNull('disabled_at')
    .update({ disabled_at: at, updated_at: at })
    .returning('*');
  return row;
}

/** A generation's key columns replaced (by an imported secret key of its fingerprint): the row as changed. */
export async function storeGenerationKey(
  trx: Knex.Transaction,
  keyId: string,
  key: Pick<KeyRow, 'encryption_key_ids' | 'algorithm' | 'public_armored' | 'public_mac' | 'private_sealed' | 'secret_sealed' | 'expires_at'>,
): Promise<KeyRow> {
  const { encryption_key_ids, algorithm, public_armored, public_mac, private_sealed, secret_sealed, expires_at } = key;
  const [row] = await trx<KeyRow>('pgp_keys')
    .where({ id: keyId })
    .update({ encryption_key_ids, algorithm, public_armored, public_mac, private_sealed, secret_sealed, expires_at })
    .returning('*');
  return row;
}

/** Schedules (a date) or unschedules (null) one generation's destruction. */
export const setGenerationDestroyAfter = async (db: Knex, keyId: string, when: Date | null): Promise<void> => {
  await db<KeyRow>('pgp_keys').where({ id: keyId }).update({ destroy_after: when });
};

/** A whole key's destruction: its generations not yet destroyed nor scheduled on their own get its date. */
export const scheduleUnscheduledGenerations = async (db: Knex, lineageId: string, when: Date): Promise<void> => {
  await db<KeyRow>('pgp_keys').where({ lineage_id: lineageId }).whereNull('destroyed_at').whereNull('destroy_after').update({ destroy_after: when });
};

/** A whole key's destruction cancelled: the generations that had its date (`when`) lose it. */
export const unscheduleGenerations = async (db: Knex, lineageId: string, when: Date): Promise<void> => {
  await db<KeyRow>('pgp_keys').where({ lineage_id: lineageId, destroy_after: when }).whereNull('destroyed_at').update({ destroy_after: null });
};

/** Lineages with a generation whose destruction is due (at most `limit`). */
export async function lineagesWithDueGenerations(db: Knex, now: Date, limit: number): Promise<string[]> {
  const rows = await db<KeyRow>('pgp_keys')
    .whereNotNull('destroy_after')
    .whereNull('destroyed_at')
    .where('destroy_after', '<=', now)
    .distinct('lineage_id')
    .limit(limit);
  return rows.map((r) => r.lineage_id);
}

/** Destroys a generation's secret material once: the destroyed row, or undefined when another sweep did. */
export async function destroyGeneration(db: Knex, keyId: string, at: Date): Promise<KeyRow | undefined> {
  const [row] = await db<KeyRow>('pgp_keys')
    .where({ id: keyId })
    .whereNull('destroyed_at')
    .update({ private_sealed: '', secret_sealed: '', destroyed_at: at })
    .returning('*');
  return row;
}

/** The lineages (of any accounts) with a generation of this fingerprint, oldest first, at most `limit`: for administrators. */
export const lineageIdsOfFingerprint = async (db: Knex, fingerprint: string, limit: number): Promise<string[]> =>
  db<KeyRow>('pgp_keys').where({ fingerprint: fingerprint.toLowerCase() }).orderBy(['created_at', 'id']).limit(limit).pluck('lineage_id');

export const findLineage = async (db: Knex, lineageId: string): Promise<LineageRow | undefined> =>
  db<LineageRow>('key_lineages').where({ id: lineageId }).first();

export const activeGeneration = async (db: Knex, lineageId: string): Promise<KeyRow | undefined> =>
  db<KeyRow>('pgp_keys').where({ lineage_id: lineageId, status: 'active' }).first();

/** Whether the account owns the lineage (its own key, not one it inherits). */
export const ownsLineage = async (db: Knex, userId: string, lineageId: string): Promise<boolean> =>
  Boolean(await db<LineageRow>('key_lineages').where({ user_id: userId, id: lineageId }).first('id'));
/** The ids of the account's own lineages that are not disabled. */
export const enabledLineageIds = async (db: Knex, userId: string): Promise<string[]> =>
  db<LineageRow>('key_lineages').where({ user_id: userId }).whereNull('disabled_at').pluck('id');

/** A rotation that changed the passphrase: the lineage's new unlock key, and each generation's secret resealed to it. */
export async function storeRekeyedLineage(
  trx: Knex.Transaction,
  lineageId: string,
  rekeyed: Pick<LineageRow, 'unlock_public' | 'unlock_locked' | 'unlock_mac'> & { secrets: Pick<KeyRow, 'id' | 'secret_sealed'>[] },
  at: Date,
): Promise<void> {
  await trx<LineageRow>('key_lineages')
    .where({ id: lineageId })
    .update({ unlock_public: rekeyed.unlock_public, unlock_locked: rekeyed.unlock_locked, unlock_mac: rekeyed.unlock_mac, updated_at: at });
  for (const g of rekeyed.secrets) await trx<KeyRow>('pgp_keys').where({ id: g.id }).update({ secret_sealed: g.secret_sealed });
}

/** A new generation's insert, not yet run: a write that lands with the rotation's history row (db/rotation.ts insertRotation). */
export const generationInsert = (db: Knex, row: Omit<KeyRow, KeyDefaults> & Partial<Pick<KeyRow, 'imported'>>): Write => db<object>('pgp_keys').insert(row);
