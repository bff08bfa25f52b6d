import type { Knex } from 'knex';
import { recordAudit } from './audit';
import { prepared } from './knex';

/** Organizations, their members and invitations, team access links and the grants the sync computes. */

export type MemberRole = 'owner' | 'admin' | 'member';
export type SyncState = 'pending' | 'running' | 'ok' | 'failed';

export interface OrganizationRow {
  id: string;
  name: string;
  owner_id: string | null;
  created_at: Date;
}

export interface MemberRow {
  user_id: string;
  organization_id: string;
  role: MemberRole;
  joined_at: Date;
}

/** A member with the account fields the API shows (never a password hash or token version). */
export interface MemberView extends MemberRow {
  username: string;
  email: string;
}

export interface InvitationRow {
  id: string;
  organization_id: string;
  email: string;
  role: Exclude<MemberRole, 'owner'>;
  invited_by: string | null;
  token_hash: string;
  expires_at: Date;
  accepted_at: Date | null;
  accepted_by: string | null;
  revoked_at: Date | null;
  revoked_by: string | null;
  created_at: Date;
}

export interface TeamLinkRow {
  grantee_id: string;
  source_id: string;
  state: SyncState;
  last_error: string | null;
  linked_at: Date;
  last_synced_at: Date | null;
  updated_at: Date;
  /** Null while requested: the link grants nothing until its source (or a manager) approves it. */
  approved_at: Date | null;
  approved_by: string | null;
}

export interface GrantRow {
  grantee_id: string;
  lineage_id: string;
  source_id: string;
  granted_at: Date;
}

export const organizations = (db: Knex) => db<OrganizationRow>('organizations');
export const members = (db: Knex) => db<MemberRow>('organization_members');
export const invitations = (db: Knex) => db<InvitationRow>('organization_invitations');
export const teamLinks = (db: Knex) => db<TeamLinkRow>('team_links');
export const teamGrants = (db: Knex) => db<GrantRow>('team_grants');

export const membershipOf = (db: Knex, userId: string) => members(db).where({ user_id: userId }).first();

/** Live members of an organization with their account fields. */
export const memberViews = (db: Knex, organizationId: string) =>
  db('organization_members as m')
    .join('users as u', 'u.id', 'm.user_id')
    .whereNull('u.deleted_at')
    .where('m.organization_id', organizationId)
    .select<MemberView[]>('m.user_id', 'm.organization_id', 'm.role', 'm.joined_at', 'u.username', 'u.email');

export async function pageMembers(
  db: Knex,
  q: { organizationId: string; excludeUserId?: string; prefix?: string; page: number; pageSize: number },
): Promise<{ items: MemberView[]; total: number }> {
  const base = memberViews(db, q.organizationId);
  if (q.excludeUserId) base.whereNot('m.user_id', q.excludeUserId);
  if (q.prefix) {
    // A prefix, not a pattern: LIKE's own wildcards in the input match themselves.
    const like = `${q.prefix.toLowerCase().replace(/[\\%_]/g, (ch) => `\\${ch}`)}%`;
    base.andWhere((w) => {
      w.whereRaw('lower(u.username) LIKE ?', [like]).orWhereRaw('lower(u.email) LIKE ?', [like]);
    });
  }
  const [items, count] = await Promise.all([
    base
      .clone()
      .orderBy('m.joined_at')
      .orderBy('m.user_id')
      .limit(q.pageSize)
      .offset((q.page - 1) * q.pageSize),
    base.clone().clearSelect().count<{ count: string }[]>({ count: '*' }),
  ]);
  return { items, total: Number(count[0]?.count ?? 0) };
}

/**
 * The lineages `userId` may use through team access: a grant counts only while the link that made it
 * is approved and still points at the same source, the source still owns the lineage, and both are
 * members of the same organization. So an unlink, a member's removal or departure revokes at once, even
 * before the next sync has deleted the rows. The one definition of "granted" is the SQL function
 * `granted_lineage_ids` (migrations 016 and 019; a function so that Postgres plans its join once per
 * session); db/keys.ts builds on it.
 */
const grantedLineageIds = (db: Knex, userId: string) => db.select('lineage_id').from(db.raw('granted_lineage_ids(?) as g(lineage_id)', [userId]));

/** Marks every link to the source pending (its keys changed); returns the accounts linked to it. One statement. */
const linksToPending = prepared<{ grantee_id: string }>(
  'links_to_pending',
  `UPDATE team_links SET state = 'pending', updated_at = :at WHERE source_id = :source RETURNING grantee_id`,
);
export async function markLinksToPending(db: Knex, sourceId: string, at: Date): Promise<string[]> {
  return (await linksToPending(db, { source: sourceId, at })).map((r) => r.grantee_id);
}

/**
 * The account's membership; an account without one (registered after migration 012) gets its own
 * one-member organization here, as its owner, named after its company (or username). The account row
 * is locked so that parallel first uses make one organization. Throws if the account is gone.
 */
export async function ensureMembership(db: Knex, userId: string): Promise<MemberRow> {
  const found = await membershipOf(db, userId);
  if (found) return found;
  return db.transaction(async (trx) => {
    const user = await trx<{ id: string; username: string; company_name: string | null }>('users')
      .where({ id: userId })
      .whereNull('deleted_at')
      .forUpdate()
      .first();
    if (!user) throw new Error(`account ${userId} is gone`);
    const again = await membershipOf(trx, userId);
    if (again) return again;
    const [org] = await organizations(trx)
      .insert({ name: user.company_name || user.username, owner_id: userId })
      .returning('*');
    const [row] = await members(trx).insert({ user_id: userId, organization_id: org.id, role: 'owner' }).returning('*');
    await recordAudit(trx, { user_id: userId, action: 'organization.created', status: 'success', target: org.id, details: { reason: 'own_organization' } });
    return row;
  });
}

/** How many lineages the account inherits right now (granted_lineage_ids). */
export async function countGrantedLineages(db: Knex, userId: string): Promise<number> {
  const [row] = (await db.from(grantedLineageIds(db, userId).as('g')).count<{ count: string }[]>({ count: '*' })) as [{ count: string }];
  return Number(row.count);
}

/** A live account's organization (null without one); undefined when there is no such live account. */
export const accountOrganization = (db: Knex, userId: string) =>
  db('users as u')
    .leftJoin('organization_members as m', 'm.user_id', 'u.id')
    .whereNull('u.deleted_at')
    .where('u.id', userId)
    .first<{ organization_id: string | null } | undefined>('m.organization_id');

/** The account's membership, locked: a concurrent move to another organization waits for the transaction. */
export const lockMembership = (trx: Knex.Transaction, userId: string) =>
  members(trx).where({ user_id: userId }).forUpdate().first<Pick<MemberRow, 'organization_id'> | undefined>('organization_id');

/** A live member of the organization with this email address (lower-case), if any. */
export const memberWithEmail = (db: Knex, organizationId: string, email: string) =>
  db('organization_members as m')
    .join('users as u', 'u.id', 'm.user_id')
    .whereNull('u.deleted_at')
    .where('m.organization_id', organizationId)
    .whereRaw('lower(u.email) = ?', [email])
    .first<{ user_id: string } | undefined>('m.user_id');

/** Who takes over an organization from its departing owner: the longest-standing admin, else the longest-standing member. */
export const heirOf = (db: Knex, organizationId: string) =>
  members(db).where({ organization_id: organizationId }).orderByRaw(`CASE role WHEN 'admin' THEN 0 ELSE 1 END`).orderBy('joined_at').first();

/** The grantee's link to `source_id`, made or replaced (one link per grantee). */
export const upsertTeamLink = (
  db: Knex,
  link: Pick<TeamLinkRow, 'grantee_id' | 'source_id' | 'state' | 'last_error' | 'linked_at' | 'updated_at' | 'approved_at' | 'approved_by'>,
) => teamLinks(db).insert(link).onConflict('grantee_id').merge(['source_id', 'state', 'last_error', 'linked_at', 'updated_at', 'approved_at', 'approved_by']);

/** Grants the grantee these lineages of its source; answers the lineage ids newly granted. */
export async function grantLineages(db: Knex, granteeId: string, sourceId: string, lineageIds: string[], at: Date): Promise<string[]> {
  if (!lineageIds.length) return [];
  const rows = await teamGrants(db)
    .insert(lineageIds.map((lineage_id) => ({ grantee_id: granteeId, lineage_id, source_id: sourceId, granted_at: at })))
    .onConflict(['grantee_id', 'lineage_id'])
    .ignore()
    .returning<{ lineage_id: string }[]>('lineage_id');
  return rows.map((r) => r.lineage_id);
}
