import type { Knex } from 'knex';
import { newestFirstPage } from './knex';
import type { KeyRow, LineageRow } from './keys';

/** What a share link points at; the kind decides which table `target_id` names. */
export type ShareKind = 'public_key' | 'api_key';

/** Computed from the row and the time, never stored: revoked wins over expired, expired over exhausted. */
export const SHARE_STATES = ['active', 'expired', 'revoked', 'exhausted'] as const;
export type ShareState = (typeof SHARE_STATES)[number];

/** Coarse client classes a view is recorded under (never the raw User-Agent or the address). */
export const UA_CLASSES = ['browser', 'cli', 'library', 'bot', 'other'] as const;
type UaClass = (typeof UA_CLASSES)[number];

export interface ShareRow {
  id: string;
  kind: ShareKind;
  user_id: string;
  target_id: string;
  token_hash: string;
  /** The token sealed under the master key (AAD: shareTokenAad); null for rows made before it was kept. */
  token_sealed: string | null;
  expires_at: Date | null;
  view_limit: number | null;
  view_count: number;
  last_viewed_at: Date | null;
  revoked_at: Date | null;
  recipient_sealed: string | null;
  created_at: Date;
}

export interface ViewRow {
  id: number;
  share_id: string;
  viewed_at: Date;
  ua_class: UaClass;
}

const shares = (db: Knex) => db<ShareRow>('share_links');
const shareViews = (db: Knex) => db<ViewRow>('share_link_views');

export async function insertShare(
  trx: Knex.Transaction,
  row: Pick<
    ShareRow,
    'id' | 'kind' | 'user_id' | 'target_id' | 'token_hash' | 'token_sealed' | 'expires_at' | 'view_limit' | 'recipient_sealed' | 'created_at'
  >,
): Promise<ShareRow> {
  const [inserted] = await shares(trx).insert(row).returning('*');
  return inserted;
}

/** The share row, locked until the transaction ends. */
export const lockShare = async (trx: Knex.Transaction, id: string): Promise<ShareRow | undefined> => shares(trx).where({ id }).forUpdate().first();

/** Revokes the share; answers it. */
export async function markShareRevoked(trx: Knex.Transaction, id: string, at: Date): Promise<ShareRow> {
  const [updated] = await shares(trx).where({ id }).update({ revoked_at: at }).returning('*');
  return updated;
}

/** One view's record for analytics: when, and the client class (never the raw User-Agent or the address). */
export const recordShareView = async (trx: Knex.Transaction, view: Omit<ViewRow, 'id'>): Promise<void> => {
  await shareViews(trx).insert(view);
};

/** View records older than `cutoff` (analytics reads the last 30 days; totals live on the share row). */
export const purgeViewsBefore = async (db: Knex, cutoff: Date): Promise<number> => shareViews(db).where('viewed_at', '<', cutoff).delete();

/** The state of a row at `now`, in SQL (same rules as shareState in lib/sharing/share-links.ts). */
const STATE_CASE = `CASE WHEN ??.revoked_at IS NOT NULL THEN 'revoked'
  WHEN ??.expires_at IS NOT NULL AND ??.expires_at <= ? THEN 'expired'
  WHEN ??.view_limit IS NOT NULL AND ??.view_count >= ??.view_limit THEN 'exhausted'
  ELSE 'active' END`;
const stateBindings = (now: Date, alias: string) => [alias, alias, alias, now, alias, alias, alias];

export interface ShareListQuery {
  userId: string;
  kind: ShareKind;
  /** Also the shares of the user's own key lineages, whoever made them (public key shares). */
  alsoOfOwnKeys?: boolean;
  targetId?: string;
  state?: ShareState;
  now: Date;
  page: number;
  pageSize: number;
}

export async function pageShares(db: Knex, q: ShareListQuery): Promise<{ items: ShareRow[]; total: number }> {
  const base = shares(db)
    .where({ kind: q.kind })
    .andWhere((w) => {
      w.where({ user_id: q.userId });
      if (q.alsoOfOwnKeys) w.orWhereIn('target_id', db<LineageRow>('key_lineages').where({ user_id: q.userId }).select('id'));
    });
  if (q.targetId) base.andWhere({ target_id: q.targetId });
  if (q.state) base.andWhereRaw(`(${STATE_CASE}) = ?`, [...stateBindings(q.now, 'share_links'), q.state]);
  return newestFirstPage<ShareRow>(base, q);
}

/** Revokes the account's usable shares of one kind (expired and used-up ones are over already); answers them. */
export const revokeActiveShares = async (
  trx: Knex.Transaction,
  q: { userId: string; kind: ShareKind; now: Date },
): Promise<Pick<ShareRow, 'id' | 'target_id' | 'view_count'>[]> =>
  shares(trx)
    .where({ user_id: q.userId, kind: q.kind })
    .andWhereRaw(`(${STATE_CASE}) = 'active'`, stateBindings(q.now, 'share_links'))
    .update({ revoked_at: q.now })
    .returning(['id', 'target_id', 'view_count']);

/**
 * Takes one view of a share, atomically: the row is updated only while it is usable (not revoked, not
 * expired, under its view limit, its owner's account not deleted). Concurrent calls queue on the row
 * lock and Postgres re-checks the WHERE clause against the row each one finds, so no number of parallel
 * views counts past the limit. Undefined when the share is unknown or not usable now.
 */
export async function takeView(db: Knex, q: { kind: ShareKind; tokenHash: string; now: Date }): Promise<ShareRow | undefined> {
  const [row] = await shares(db)
    .where({ token_hash: q.tokenHash, kind: q.kind })
    .whereNull('revoked_at')
    .andWhere((w) => {
      w.whereNull('expires_at').orWhere('expires_at', '>', q.now);
    })
    .andWhere((w) => {
      w.whereNull('view_limit').orWhere('view_count', '<', db.ref('view_limit'));
    })
    .whereExists((e) => {
      e.select(db.raw('1')).from('users').whereRaw('users.id = share_links.user_id').whereNull('users.deleted_at');
    })
    .update({ view_count: db.raw('view_count + 1'), last_viewed_at: q.now })
    .returning('*');
  return row;
}

/** A share by token hash, with whether its owner's account still exists (for the reason a view failed). */
export async function findByTokenHash(db: Knex, kind: ShareKind, tokenHash: string): Promise<(ShareRow & { owner_deleted: boolean }) | undefined> {
  return db('share_links as s')
    .join('users as u', 'u.id', 's.user_id')
    .where({ 's.token_hash': tokenHash, 's.kind': kind })
    .first<(ShareRow & { owner_deleted: boolean }) | undefined>('s.*', db.raw('u.deleted_at IS NOT NULL AS owner_deleted'));
}

export interface Analytics {
  byState: { state: ShareState; shares: number; views: number }[];
  byDay: { day: string; views: number }[];
  topTargets: { target_id: string; views: number; shares: number }[];
  recent: { viewed_at: Date; share_id: string; target_id: string; ua_class: UaClass }[];
}

/** One account's numbers for one kind: shares and views by state, views per UTC day since `since`, top targets, latest views. */
export async function shareAnalytics(
  db: Knex,
  q: { userId: string; kind: ShareKind; now: Date; since: Date; top: number; recent: number },
): Promise<Analytics> {
  const own = (b: Knex.QueryBuilder) => b.where({ 's.user_id': q.userId, 's.kind': q.kind });
  const [byState, byDay, topTargets, recent] = await Promise.all([
    own(db('share_links as s'))
      .select(
        db.raw(`${STATE_CASE} AS state`, stateBindings(q.now, 's')),
        db.raw('count(*)::int AS shares'),
        db.raw('coalesce(sum(s.view_count), 0)::int AS views'),
      )
      .groupBy('state') as Promise<Analytics['byState']>,
    own(db('share_link_views as v').join('share_links as s', 's.id', 'v.share_id'))
      .where('v.viewed_at', '>=', q.since)
      .andWhere('v.viewed_at', '<=', q.now)
      .select(db.raw(`to_char(v.viewed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day`), db.raw('count(*)::int AS views'))
      .groupBy('day')
      .orderBy('day') as Promise<Analytics['byDay']>,
    own(db('share_links as s'))
      .select('s.target_id', db.raw('sum(s.view_count)::int AS views'), db.raw('count(*)::int AS shares'))
      .groupBy('s.target_id')
      .havingRaw('sum(s.view_count) > 0')
      .orderBy([{ column: 'views', order: 'desc' }, { column: 's.target_id' }])
      .limit(q.top) as Promise<Analytics['topTargets']>,
    own(db('share_link_views as v').join('share_links as s', 's.id', 'v.share_id'))
      .select('v.viewed_at', 'v.share_id', 's.target_id', 'v.ua_class')
      .orderBy([
        { column: 'v.viewed_at', order: 'desc' },
        { column: 'v.id', order: 'desc' },
      ])
      .limit(q.recent) as Promise<Analytics['recent']>,
  ]);
  return { byState, byDay, topTargets, recent };
}

/**
 * The key lineages (and their current generations) that public key shares point at, for decorating
 * lists and analytics. Rows are returned as stored; whoever serves a public key verifies its MAC first.
 */
export async function keyTargets(db: Knex, lineageIds: string[]): Promise<Map<string, { lineage: LineageRow; current: KeyRow }>> {
  const ids = [...new Set(lineageIds)];
  if (!ids.length) return new Map();
  const [lineages, current] = await Promise.all([
    db<LineageRow>('key_lineages').whereIn('id', ids),
    db<KeyRow>('pgp_keys').whereIn('lineage_id', ids).andWhere({ status: 'active' }),
  ]);
  const out = new Map<string, { lineage: LineageRow; current: KeyRow }>();
  for (const lineage of lineages) {
    const key = current.find((k) => k.lineage_id === lineage.id);
    if (key) out.set(lineage.id, { lineage, current: key });
  }
  return out;
}
