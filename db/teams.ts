import type { Knex } from 'knex';
import { recordAudit } from './audit';
import { newestFirstPage, prepared } from './knex';

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

const organizations = (db: Knex) => db<OrganizationRow>('organizations');
const members = (db: Knex) => db<MemberRow>('organization_members');
const invitations = (db: Knex) => db<InvitationRow>('organization_invitations');
const teamLinks = (db: Knex) => db<TeamLinkRow>('team_links');
const teamGrants = (db: Knex) => db<GrantRow>('team_grants');

export const membershipOf = async (db: Knex, userId: string): Promise<MemberRow | undefined> => members(db).where({ user_id: userId }).first();

/** The account's membership row, locked until the transaction ends. */
export const lockMember = async (trx: Knex.Transaction, userId: string): Promise<MemberRow | undefined> =>
  members(trx).where({ user_id: userId }).forUpdate().first();

export const deleteMember = async (trx: Knex.Transaction, userId: string): Promise<void> => {
  await members(trx).where({ user_id: userId }).delete();
};

export const insertMember = async (trx: Knex.Transaction, row: MemberRow): Promise<void> => {
  await members(trx).insert(row);
};

export async function countMembers(db: Knex, organizationId: string): Promise<number> {
  return Number((await members(db).where({ organization_id: organizationId }).count<{ count: string }[]>({ count: '*' }))[0]?.count ?? 0);
}

export const findOrganization = async (db: Knex, id: string): Promise<OrganizationRow | undefined> => organizations(db).where({ id }).first();

/** The organization row, locked: what serialises its invitations and membership changes. */
export const lockOrganization = async (trx: Knex.Transaction, id: string): Promise<OrganizationRow | undefined> =>
  organizations(trx).where({ id }).forUpdate().first();

export const deleteOrganization = async (trx: Knex.Transaction, id: string): Promise<void> => {
  await organizations(trx).where({ id }).delete();
};

/** The heir becomes the organization's owner: its member row and the organization's owner_id, in that order. */
export async function transferOwnership(trx: Knex.Transaction, organizationId: string, heirId: string): Promise<void> {
  await members(trx).where({ user_id: heirId }).update({ role: 'owner' });
  await organizations(trx).where({ id: organizationId }).update({ owner_id: heirId });
}

/** Live members of an organization with their account fields. */
const memberViews = (db: Knex, organizationId: string) =>
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
    await recordAudit(trx, { user_id: userId, action: 'organizations.create', status: 'success', target: org.id, details: { reason: 'own_organization' } });
    return row;
  });
}

/** How many lineages the account inherits right now (granted_lineage_ids). */
export async function countGrantedLineages(db: Knex, userId: string): Promise<number> {
  const [row] = (await db.from(grantedLineageIds(db, userId).as('g')).count<{ count: string }[]>({ count: '*' })) as [{ count: string }];
  return Number(row.count);
}

/** A live account's organization (null without one); undefined when there is no such live account. */
export const accountOrganization = async (db: Knex, userId: string): Promise<{ organization_id: string | null } | undefined> =>
  db('users as u')
    .leftJoin('organization_members as m', 'm.user_id', 'u.id')
    .whereNull('u.deleted_at')
    .where('u.id', userId)
    .first<{ organization_id: string | null } | undefined>('m.organization_id');

/** The account's membership, locked: a concurrent move to another organization waits for the transaction. */
export const lockMembership = async (trx: Knex.Transaction, userId: string): Promise<Pick<MemberRow, 'organization_id'> | undefined> =>
  members(trx).where({ user_id: userId }).forUpdate().first<Pick<MemberRow, 'organization_id'> | undefined>('organization_id');

/** A live member of the organization with this email address (lower-case), if any. */
export const memberWithEmail = async (db: Knex, organizationId: string, email: string): Promise<{ user_id: string } | undefined> =>
  db('organization_members as m')
    .join('users as u', 'u.id', 'm.user_id')
    .whereNull('u.deleted_at')
    .where('m.organization_id', organizationId)
    .whereRaw('lower(u.email) = ?', [email])
    .first<{ user_id: string } | undefined>('m.user_id');

/** Who takes over an organization from its departing owner: the longest-standing admin, else the longest-standing member. */
export const heirOf = async (db: Knex, organizationId: string): Promise<MemberRow | undefined> =>
  members(db).where({ organization_id: organizationId }).orderByRaw(`CASE role WHEN 'admin' THEN 0 ELSE 1 END`).orderBy('joined_at').first();

/** The owner and admins of an organization (live accounts). */
export const managerIds = async (db: Knex, organizationId: string): Promise<string[]> =>
  (await memberViews(db, organizationId).whereIn('m.role', ['owner', 'admin'])).map((m) => m.user_id);

/** Open invitations of an organization: neither accepted nor revoked, and not expired at `now`. */
export async function countOpenInvitations(db: Knex, organizationId: string, now: Date): Promise<number> {
  const open = await invitations(db)
    .where({ organization_id: organizationId })
    .whereNull('accepted_at')
    .whereNull('revoked_at')
    .where('expires_at', '>', now)
    .count<{ count: string }[]>({ count: '*' });
  return Number(open[0]?.count ?? 0);
}

export async function insertInvitation(
  trx: Knex.Transaction,
  row: Pick<InvitationRow, 'organization_id' | 'email' | 'role' | 'invited_by' | 'token_hash' | 'expires_at' | 'created_at'>,
): Promise<InvitationRow> {
  const [inserted] = await invitations(trx).insert(row).returning('*');
  return inserted;
}

/** A page of an organization's invitations, newest first, optionally in one state at `now` (accepted or revoked for good, else expired once past expires_at). */
export async function pageInvitations(
  db: Knex,
  organizationId: string,
  q: { state?: 'pending' | 'accepted' | 'revoked' | 'expired'; now: Date; page: number; pageSize: number },
): Promise<{ items: InvitationRow[]; total: number }> {
  const base = invitations(db).where({ organization_id: organizationId });
  if (q.state === 'accepted') base.whereNotNull('accepted_at');
  if (q.state === 'revoked') base.whereNull('accepted_at').whereNotNull('revoked_at');
  if (q.state === 'expired') base.whereNull('accepted_at').whereNull('revoked_at').where('expires_at', '<=', q.now);
  if (q.state === 'pending') base.whereNull('accepted_at').whereNull('revoked_at').where('expires_at', '>', q.now);
  return newestFirstPage<InvitationRow>(base, q);
}

export const lockInvitation = async (trx: Knex.Transaction, id: string): Promise<InvitationRow | undefined> =>
  invitations(trx).where({ id }).forUpdate().first();

export const findInvitationByTokenHash = async (db: Knex, tokenHash: string): Promise<InvitationRow | undefined> =>
  invitations(db).where({ token_hash: tokenHash }).first();

export const lockInvitationByTokenHash = async (trx: Knex.Transaction, tokenHash: string): Promise<InvitationRow | undefined> =>
  invitations(trx).where({ token_hash: tokenHash }).forUpdate().first();

export const markInvitationRevoked = async (trx: Knex.Transaction, id: string, by: string, at: Date): Promise<void> => {
  await invitations(trx).where({ id }).update({ revoked_at: at, revoked_by: by });
};

export const markInvitationAccepted = async (trx: Knex.Transaction, id: string, by: string, at: Date): Promise<void> => {
  await invitations(trx).where({ id }).update({ accepted_at: at, accepted_by: by });
};

/** The account's own link (as grantee), if any. */
export const teamLinkOfGrantee = async (db: Knex, granteeId: string): Promise<TeamLinkRow | undefined> =>
  teamLinks(db).where({ grantee_id: granteeId }).first();

/** The account's own link (as grantee), locked: runs of its sync and decisions on it take turns. */
export const lockTeamLinkOfGrantee = async (trx: Knex.Transaction, granteeId: string): Promise<TeamLinkRow | undefined> =>
  teamLinks(trx).where({ grantee_id: granteeId }).forUpdate().first();

export const deleteTeamLink = async (trx: Knex.Transaction, granteeId: string): Promise<void> => {
  await teamLinks(trx).where({ grantee_id: granteeId }).delete();
};

/** The link's sync state (and when it last ran, or why it failed). */
export const setTeamLinkState = async (
  db: Knex,
  granteeId: string,
  fields: Pick<TeamLinkRow, 'state' | 'updated_at'> & Partial<Pick<TeamLinkRow, 'last_error' | 'last_synced_at'>>,
): Promise<void> => {
  await teamLinks(db).where({ grantee_id: granteeId }).update(fields);
};

/** Approves the grantee's link and marks it pending (to be synced); answers the link. */
export async function approveTeamLink(trx: Knex.Transaction, granteeId: string, approvedBy: string, at: Date): Promise<TeamLinkRow> {
  const [approved] = await teamLinks(trx)
    .where({ grantee_id: granteeId })
    .update({ approved_at: at, approved_by: approvedBy, state: 'pending', updated_at: at })
    .returning('*');
  return approved;
}

/** Every link naming the account as its source goes back to awaiting approval. */
export const withdrawApprovalsOfSource = async (trx: Knex.Transaction, sourceId: string): Promise<void> => {
  await teamLinks(trx).where({ source_id: sourceId }).update({ approved_at: null, approved_by: null });
};

/**
 * A page of links, newest request first (then by grantee): those naming `sourceId` as source, or those
 * of every member of `organizationId`; optionally only the approved or only the pending ones.
 */
export async function pageTeamLinks(
  db: Knex,
  q: ({ sourceId: string } | { organizationId: string }) & { approval?: 'pending' | 'approved'; page: number; pageSize: number },
): Promise<{ items: TeamLinkRow[]; total: number }> {
  const base = teamLinks(db);
  if ('organizationId' in q) base.whereIn('grantee_id', members(db).where({ organization_id: q.organizationId }).select('user_id'));
  else base.where({ source_id: q.sourceId });
  if (q.approval)
    base.where((w) => {
      if (q.approval === 'approved') w.whereNotNull('approved_at');
      else w.whereNull('approved_at');
    });
  const [items, count] = await Promise.all([
    base
      .clone()
      .orderBy([{ column: 'linked_at', order: 'desc' }, { column: 'grantee_id' }])
      .limit(q.pageSize)
      .offset((q.page - 1) * q.pageSize),
    base.clone().count<{ count: string }[]>({ count: '*' }),
  ]);
  return { items, total: Number(count[0]?.count ?? 0) };
}

/** Deletes the grantee's grants; answers how many there were. */
export const deleteGrantsOfGrantee = async (trx: Knex.Transaction, granteeId: string): Promise<number> =>
  teamGrants(trx).where({ grantee_id: granteeId }).delete();

/** Deletes the grantee's grants; answers their lineage ids. */
export async function deleteGrantedLineages(trx: Knex.Transaction, granteeId: string): Promise<string[]> {
  const removed = await teamGrants(trx).where({ grantee_id: granteeId }).delete().returning<{ lineage_id: string }[]>('lineage_id');
  return removed.map((r) => r.lineage_id);
}

/** Deletes the grantee's grants made through any other source; answers how many there were. */
export const deleteGrantsFromOtherSources = async (trx: Knex.Transaction, granteeId: string, sourceId: string): Promise<number> =>
  teamGrants(trx).where({ grantee_id: granteeId }).whereNot({ source_id: sourceId }).delete();

/** Deletes the grants others inherited from the account. */
export const deleteGrantsFromSource = async (trx: Knex.Transaction, sourceId: string): Promise<void> => {
  await teamGrants(trx).where({ source_id: sourceId }).delete();
};

/** Deletes the grantee's grants but those of `wanted` from `sourceId`; answers the lineage ids deleted. */
export async function deleteUnwantedGrants(trx: Knex.Transaction, granteeId: string, sourceId: string, wanted: string[]): Promise<string[]> {
  const removed = await teamGrants(trx)
    .where({ grantee_id: granteeId })
    .andWhere((w) => {
      w.whereNot({ source_id: sourceId }).orWhereNotIn('lineage_id', wanted);
    })
    .delete()
    .returning<{ lineage_id: string }[]>('lineage_id');
  return removed.map((r) => r.lineage_id);
}

/** The grantee's link to `source_id`, made or replaced (one link per grantee). */
export const upsertTeamLink = async (
  db: Knex,
  link: Pick<TeamLinkRow, 'grantee_id' | 'source_id' | 'state' | 'last_error' | 'linked_at' | 'updated_at' | 'approved_at' | 'approved_by'>,
): Promise<void> => {
  await teamLinks(db)
    .insert(link)
    .onConflict('grantee_id')
    .merge(['source_id', 'state', 'last_error', 'linked_at', 'updated_at', 'approved_at', 'approved_by']);
};

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

/** A member who joined through an invitation, with what it was invited as and its account fields. */
export interface InviteeView extends MemberView {
  invitation_id: string;
  invited_as: InvitationRow['role'];
}

/**
 * Live members of `organizationId` who joined it through an invitation `inviterId` made and that was
 * accepted at or after `since`, longest-standing first; their member rows locked.
 */
export async function lockRecentInvitees(trx: Knex.Transaction, inviterId: string, organizationId: string, since: Date): Promise<InviteeView[]> {
  return trx('organization_invitations as i')
    .join('organization_members as m', function () {
      this.on('m.user_id', '=', 'i.accepted_by').andOn('m.organization_id', '=', 'i.organization_id');
    })
    .join('users as u', 'u.id', 'm.user_id')
    .whereNull('u.deleted_at')
    .where({ 'i.invited_by': inviterId, 'i.organization_id': organizationId })
    .where('i.accepted_at', '>=', since)
    .orderBy('m.joined_at')
    .forUpdate('m')
    .select<InviteeView[]>('m.user_id', 'm.organization_id', 'm.role', 'm.joined_at', 'u.username', 'u.email', 'i.id as invitation_id', 'i.role as invited_as');
}

/** A member's role in its organization (never `owner`: ownership moves through transferOwnership). */
export const setMemberRole = async (trx: Knex.Transaction, userId: string, role: Exclude<MemberRole, 'owner'>): Promise<void> => {
  await members(trx).where({ user_id: userId }).update({ role });
};

/** Revokes every open invitation (unused, unrevoked, unexpired at `at`) these accounts made; answers them. */
export async function revokeOpenInvitationsBy(trx: Knex.Transaction, inviterIds: string[], by: string, at: Date): Promise<InvitationRow[]> {
  if (!inviterIds.length) return [];
  return invitations(trx)
    .whereIn('invited_by', inviterIds)
    .whereNull('accepted_at')
    .whereNull('revoked_at')
    .where('expires_at', '>', at)
    .update({ revoked_at: at, revoked_by: by })
    .returning('*');
}

/** A revoked invitation's token joins again. */
export const markInvitationUnrevoked = async (trx: Knex.Transaction, id: string): Promise<void> => {
  await invitations(trx).where({ id }).update({ revoked_at: null, revoked_by: null });
};

/**
 * Approved links, locked, that were approved at or after `since` by one of `approvers`, or that
 * `granteeId` requested at or after `since` (and someone approved since).
 */
export async function lockRecentlyApprovedLinks(trx: Knex.Transaction, q: { granteeId: string; approvers: string[]; since: Date }): Promise<TeamLinkRow[]> {
  return teamLinks(trx)
    .whereNotNull('approved_at')
    .andWhere((w) => {
      w.where((a) => {
        a.whereIn('approved_by', q.approvers).andWhere('approved_at', '>=', q.since);
      }).orWhere((g) => {
        g.where({ grantee_id: q.granteeId }).andWhere('linked_at', '>=', q.since);
      });
    })
    .orderBy('grantee_id')
    .forUpdate();
}

/** These links go back to awaiting approval (and to be synced). */
export const withdrawApprovals = async (trx: Knex.Transaction, granteeIds: string[], at: Date): Promise<void> => {
  if (!granteeIds.length) return;
  await teamLinks(trx).whereIn('grantee_id', granteeIds).update({ approved_at: null, approved_by: null, state: 'pending', updated_at: at });
};
