import type { Knex } from 'knex';
import type { Container } from '../container';
import { conflict, forbidden, invalid, notFound } from '../errors';
import { emitEvent } from '../events';
import { notYours } from '../auth/ownership';
import { isManager, outranks } from './org-roles';
import { recordAudit, type RequestMeta } from '../../db/audit';
import type { LineageRow } from '../../db/keys';
import {
  upsertTeamLink,
  lockMembership,
  grantLineages,
  countGrantedLineages,
  accountOrganization,
  ensureMembership,
  markLinksToPending,
  membershipOf,
  pageMembers,
  teamLinkOfGrantee,
  lockTeamLinkOfGrantee,
  deleteTeamLink,
  setTeamLinkState,
  approveTeamLink,
  withdrawApprovalsOfSource,
  pageTeamLinks,
  deleteGrantsOfGrantee,
  deleteGrantedLineages,
  deleteGrantsFromOtherSources,
  deleteGrantsFromSource,
  deleteUnwantedGrants,
  lockRecentlyApprovedLinks,
  withdrawApprovals,
  type MemberView,
  type SyncState,
  type TeamLinkRow,
} from '../../db/teams';
import { usersByIds } from '../../db/users';
import { enabledLineageIds } from '../../db/keys';
import type { AuditAction } from '../event-names';

/**
 * Team access: an account links to one source member of its organization and inherits the source's
 * own keys (never keys the source itself inherits: one hop), once the source (or a manager above it,
 * see decidableLink) has approved the link. The link is a wish; the grants are what
 * the `sync-team-access` job (queue `team-sync`) computed from it, one grantee per run, in one
 * transaction, so any number of runs (crashed ones included) leave the same rows. Key lookups count a
 * grant only while its link is approved and the shared organization still holds (db/teams.ts grantedLineageIds),
 * so revocation does not wait for a sync.
 */

type Origin = { request_id?: string | null; ip?: string | null };

/** Queues one sync run for the grantee (no job id: a run queued after a change must not be deduplicated away). */
async function enqueueSync(c: Container, granteeId: string, meta?: Partial<RequestMeta>): Promise<void> {
  await c.jobs.enqueue('sync-team-access', { grantee_id: granteeId }, { meta });
}

/**
 * The source's set of keys changed (one generated, imported or disabled) or it left: every account linked
 * to it is marked pending and re-synced. A rotation changes no grant (a grant names a lineage, and lookups
 * find its current generation), so it re-syncs nothing. Called after the change committed; a failure is logged, not thrown (the
 * change stands, and the next sync of those accounts catches up).
 */
export async function resyncLinkedTo(c: Container, sourceId: string, reason: string, meta?: Partial<RequestMeta>): Promise<void> {
  try {
    const grantees = await markLinksToPending(c.db, sourceId, c.clock.now());
    await Promise.all(grantees.map((g) => enqueueSync(c, g, meta)));
  } catch (err) {
    c.log.warn({ err, reason }, 'could not queue team access re-syncs');
  }
}

/** What leaving an organization undid, for the after-commit part (afterDetach). */
export interface Detached {
  /** The departing account's own link (now deleted), if it had one. */
  link?: TeamLinkRow;
  /** Accounts linked to the departing account: their grants from it are gone; they are re-synced. */
  grantees: string[];
}

/**
 * In the transaction that takes `userId` out of its organization (removal, joining another, deletion):
 * its own link and inherited grants end, and the grants others inherited from it end too. Their links
 * stay (marked pending; the re-sync finds the source gone and says so in their status).
 */
export async function detachMember(trx: Knex.Transaction, userId: string, at: Date, reason: string, meta?: Partial<RequestMeta>): Promise<Detached> {
  const link = await lockTeamLinkOfGrantee(trx, userId);
  const revoked = await deleteGrantsOfGrantee(trx, userId);
  if (link) {
    await deleteTeamLink(trx, userId);
    await recordAudit(trx, { user_id: userId, action: 'team_links.unlink', status: 'success', target: link.source_id, details: { reason, revoked } }, meta);
  }
  await deleteGrantsFromSource(trx, userId);
  // Approval was given within the organization: a source that comes back must approve again.
  await withdrawApprovalsOfSource(trx, userId);
  return { link, grantees: await markLinksToPending(trx, userId, at) };
}

/** After the departure committed: the departing account hears of its ended link; its grantees re-sync. */
export async function afterDetach(c: Container, userId: string, detached: Detached, reason: string, meta?: Partial<RequestMeta>): Promise<void> {
  if (detached.link) await emitEvent(c, userId, 'team_links.unlinked', { source_user_id: detached.link.source_id, reason });
  for (const grantee of detached.grantees) {
    await enqueueSync(c, grantee, meta).catch((err: unknown) => c.log.warn({ err }, 'could not queue a team access re-sync'));
  }
}

/** A member as team access shows it. */
export const memberOut = (m: MemberView) => ({ user_id: m.user_id, username: m.username, email: m.email, role: m.role, joined_at: m.joined_at.toISOString() });

/** Eligible sources: members of the caller's organization, live, not the caller; by username or email prefix. */
export async function searchSources(c: Container, userId: string, q: { prefix?: string; page: number; pageSize: number }) {
  const mine = await ensureMembership(c.db, userId);
  const { items, total } = await pageMembers(c.db, {
    organizationId: mine.organization_id,
    excludeUserId: userId,
    prefix: q.prefix,
    page: q.page,
    pageSize: q.pageSize,
  });
  return { items: items.map(memberOut), total };
}

/** A live member of the caller's organization other than the caller, or 404 (audited when it exists elsewhere). */
async function eligibleSource(c: Container, db: Knex, userId: string, organizationId: string, sourceId: string, meta: RequestMeta): Promise<void> {
  const source = await accountOrganization(db, sourceId);
  if (source?.organization_id === organizationId) return;
  throw await notYours(
    c,
    { userId, resource: 'team_member', target: sourceId, existsElsewhere: Boolean(source), meta },
    notFound('member_not_found', 'No such member in your organization.'),
  );
}

export type TeamStatus = Awaited<ReturnType<typeof teamStatus>>;

const approvalOf = (link: Pick<TeamLinkRow, 'approved_at'>) => (link.approved_at ? 'approved' : 'pending');

/** The caller's link and its sync state; `inherited_keys` counts what key lookups grant right now. */
export async function teamStatus(c: Container, userId: string) {
  const link = await teamLinkOfGrantee(c.db, userId);
  const count = await countGrantedLineages(c.db, userId);
  const [source] = link ? await usersByIds(c.db, [link.source_id]) : [];
  return {
    linked: Boolean(link),
    state: link?.state ?? 'unlinked',
    source: source && !source.deleted_at ? { user_id: source.id, username: source.username, email: source.email } : null,
    source_user_id: link?.source_id ?? null,
    linked_at: link?.linked_at.toISOString() ?? null,
    approval: link ? approvalOf(link) : null,
    approved_at: link?.approved_at?.toISOString() ?? null,
    last_synced_at: link?.last_synced_at?.toISOString() ?? null,
    last_error: link?.last_error ?? null,
    inherited_keys: Number(count),
  };
}

/**
 * Links the caller to a source member (or changes it): grants from a previous source end in the same
 * transaction, so there is no moment with both. A new source must approve the link before it grants
 * anything (the request is audited and announced to it); linking again to the same source keeps its
 * approval. The grants follow from the sync it queues.
 */
export async function linkSource(c: Container, userId: string, sourceId: string, meta: RequestMeta): Promise<TeamStatus> {
  if (sourceId === userId)
    throw invalid('cannot_link_self', 'An account cannot link to itself.', [{ path: 'body.source_user_id', message: 'must be another member' }]);
  const now = c.clock.now();
  const mine = await ensureMembership(c.db, userId);
  const { previous, requested } = await c.db.transaction(async (trx) => {
    // The caller's membership, locked: a concurrent move to another organization waits for this link.
    const locked = await lockMembership(trx, userId);
    await eligibleSource(c, trx, userId, locked?.organization_id ?? mine.organization_id, sourceId, meta);
    const before = await lockTeamLinkOfGrantee(trx, userId);
    const kept =
      before?.source_id === sourceId ? { approved_at: before.approved_at, approved_by: before.approved_by } : { approved_at: null, approved_by: null };
    await upsertTeamLink(trx, { grantee_id: userId, source_id: sourceId, state: 'pending', last_error: null, linked_at: now, updated_at: now, ...kept });
    const revoked = await deleteGrantsFromOtherSources(trx, userId, sourceId);
    const approval = approvalOf(kept);
    await recordAudit(
      trx,
      {
        user_id: userId,
        action: 'team_links.link',
        status: 'success',
        target: sourceId,
        details: { previous_source_user_id: before?.source_id ?? null, revoked, approval },
      },
      meta,
    );
    const requested = before?.source_id !== sourceId;
    if (requested) await recordAudit(trx, { user_id: sourceId, action: 'team_links.request', status: 'success', target: userId, details: {} }, meta);
    return { previous: before, requested };
  });
  await emitEvent(c, userId, 'team_links.linked', { source_user_id: sourceId, previous_source_user_id: previous?.source_id ?? null });
  if (requested) await emitEvent(c, sourceId, 'team_links.requested', { grantee_user_id: userId });
  await enqueueSync(c, userId, meta);
  return teamStatus(c, userId);
}

/** Deletes a link and every grant made through it, in the caller's transaction; audited for the grantee. */
async function endLink(trx: Knex.Transaction, link: TeamLinkRow, reason: string, meta: RequestMeta): Promise<number> {
  const revoked = await deleteGrantsOfGrantee(trx, link.grantee_id);
  await deleteTeamLink(trx, link.grantee_id);
  await recordAudit(
    trx,
    { user_id: link.grantee_id, action: 'team_links.unlink', status: 'success', target: link.source_id, details: { reason, revoked } },
    meta,
  );
  return revoked;
}

/**
 * Ends the caller's link and every key it inherited through it, at once. Without a link there is nothing
 * to end (undefined): repeating an unlink is harmless, as repeating any DELETE of the API is.
 */
export async function unlinkSource(c: Container, userId: string, meta: RequestMeta): Promise<{ source_user_id: string; revoked_keys: number } | undefined> {
  const done = await c.db.transaction(async (trx) => {
    const link = await lockTeamLinkOfGrantee(trx, userId);
    if (!link) return undefined;
    return { source_user_id: link.source_id, revoked_keys: await endLink(trx, link, 'unlinked', meta) };
  });
  if (done) await emitEvent(c, userId, 'team_links.unlinked', { source_user_id: done.source_user_id, reason: 'unlinked' });
  return done;
}

/**
 * The link of `granteeId`, locked, if `actorId` may decide on it (approve or end it): its source, or a
 * manager of the organization both belong to who outranks the source (the owner for any source, an
 * admin for plain members). Never its grantee, who may only end it (unlinkSource). Otherwise 404
 * (audited when the link exists), or 403 for a manager the source outranks.
 */
async function decidableLink(
  c: Container,
  trx: Knex.Transaction,
  actorId: string,
  granteeId: string,
  action: AuditAction,
  meta: RequestMeta,
): Promise<TeamLinkRow> {
  const link = granteeId === actorId ? undefined : await lockTeamLinkOfGrantee(trx, granteeId);
  if (link?.source_id === actorId) return link;
  if (link) {
    // One after another: a transaction is one connection, which runs one query at a time.
    const actor = await membershipOf(trx, actorId);
    const source = await membershipOf(trx, link.source_id);
    const grantee = await membershipOf(trx, link.grantee_id);
    if (
      actor &&
      source &&
      grantee &&
      isManager(actor) &&
      actor.organization_id === source.organization_id &&
      actor.organization_id === grantee.organization_id
    ) {
      if (outranks(actor.role, source.role)) return link;
      await recordAudit(trx, { user_id: actorId, action, status: 'failure', target: granteeId, details: { reason: 'organization_owner_required' } }, meta);
      throw forbidden('organization_owner_required', "Only the owner may decide on links to the owner's or an admin's keys.");
    }
  }
  throw await notYours(
    c,
    { userId: actorId, resource: 'team_link', target: granteeId, existsElsewhere: Boolean(link), meta },
    notFound('team_link_not_found', 'No such team access link for you to decide on.'),
  );
}

export type LinkView = Awaited<ReturnType<typeof linkViews>>[number];

type Person = { user_id: string; username: string; email: string };

/** Links with both sides' account fields, for the lists and the answers of approve. */
async function linkViews(db: Knex, rows: TeamLinkRow[]) {
  const users = await usersByIds(
    db,
    rows.flatMap((l) => [l.grantee_id, l.source_id]),
  );
  const byId = new Map(users.map((u) => [u.id, { user_id: u.id, username: u.username, email: u.email } satisfies Person]));
  return rows.map((l) => ({
    grantee: byId.get(l.grantee_id) ?? null,
    source: byId.get(l.source_id) ?? null,
    approval: approvalOf(l),
    requested_at: l.linked_at.toISOString(),
    approved_at: l.approved_at?.toISOString() ?? null,
    approved_by_user_id: l.approved_by,
    state: l.state,
    last_synced_at: l.last_synced_at?.toISOString() ?? null,
  }));
}

/**
 * Links, requested and approved, newest request first: `source`, those naming the caller as source;
 * `organization` (owners and admins), those of every member of the caller's organization.
 */
export async function listLinks(
  c: Container,
  userId: string,
  q: { view: 'source' | 'organization'; approval?: 'pending' | 'approved'; page: number; pageSize: number },
) {
  let whose: { sourceId: string } | { organizationId: string } = { sourceId: userId };
  if (q.view === 'organization') {
    const mine = await ensureMembership(c.db, userId);
    if (!isManager(mine)) throw forbidden('organization_admin_required', "Only the owner or an admin may list the organization's links.");
    whose = { organizationId: mine.organization_id };
  }
  const { items, total } = await pageTeamLinks(c.db, { ...whose, approval: q.approval, page: q.page, pageSize: q.pageSize });
  return { items: await linkViews(c.db, items), total };
}

/**
 * Approves `granteeId`'s link to `sourceId` (see decidableLink for who may): from then on the sync
 * grants the source's keys. The approval names the source, so a link whose grantee changed its source
 * since is refused (409 `team_link_changed`). Approving an approved link changes nothing.
 */
export async function approveLink(c: Container, actorId: string, granteeId: string, sourceId: string, meta: RequestMeta): Promise<LinkView> {
  const now = c.clock.now();
  const { link, changed } = await c.db.transaction(async (trx) => {
    const link = await decidableLink(c, trx, actorId, granteeId, 'team_links.approve', meta);
    if (link.source_id !== sourceId) throw conflict('team_link_changed', 'This member now links to another source; list the links again.');
    if (link.approved_at) return { link, changed: false };
    const approved = await approveTeamLink(trx, granteeId, actorId, now);
    // One row for each party: the approver, the grantee and the source (who may be the approver).
    const parties = new Map([
      [actorId, granteeId],
      [granteeId, sourceId],
    ]);
    if (!parties.has(sourceId)) parties.set(sourceId, granteeId);
    for (const [who, target] of parties) {
      await recordAudit(
        trx,
        {
          user_id: who,
          action: 'team_links.approve',
          status: 'success',
          target,
          details: { grantee_user_id: granteeId, source_user_id: sourceId, approved_by: actorId },
        },
        meta,
      );
    }
    return { link: approved, changed: true };
  });
  if (changed) {
    for (const who of new Set([granteeId, sourceId, actorId]))
      await emitEvent(c, who, 'team_links.approved', { grantee_user_id: granteeId, source_user_id: sourceId, approved_by: actorId });
    await enqueueSync(c, granteeId, meta);
  }
  return (await linkViews(c.db, [link]))[0];
}

/**
 * Declines a link still awaiting approval (see decidableLink for who may): the request is removed, so the
 * grantee may ask again or link elsewhere. An approved link is ended instead (DELETE), never rejected:
 * 409 `team_link_not_pending`. Audited for the decider and the grantee; the grantee hears it as an unlink.
 */
export async function rejectLink(
  c: Container,
  actorId: string,
  granteeId: string,
  sourceId: string,
  meta: RequestMeta,
): Promise<{ grantee_user_id: string; source_user_id: string; status: 'rejected' }> {
  await c.db.transaction(async (trx) => {
    const link = await decidableLink(c, trx, actorId, granteeId, 'team_links.reject', meta);
    if (link.source_id !== sourceId) throw conflict('team_link_changed', 'This member now links to another source; list the links again.');
    if (link.approved_at) {
      // Outside the transaction, which the refusal rolls back.
      await recordAudit(
        c.db,
        { user_id: actorId, action: 'team_links.reject', status: 'failure', target: granteeId, details: { reason: 'not_pending' } },
        meta,
      );
      throw conflict('team_link_not_pending', 'This link is already approved: end it instead (DELETE /team-access/links/{grantee_user_id}).');
    }
    await endLink(trx, link, 'rejected', meta);
    const details = { grantee_user_id: granteeId, source_user_id: sourceId, rejected_by: actorId };
    for (const who of new Set([actorId, granteeId]))
      await recordAudit(trx, { user_id: who, action: 'team_links.reject', status: 'success', target: who === granteeId ? sourceId : granteeId, details }, meta);
  });
  for (const who of new Set([granteeId, sourceId, actorId]))
    await emitEvent(c, who, 'team_links.unlinked', { grantee_user_id: granteeId, source_user_id: sourceId, reason: 'rejected' });
  return { grantee_user_id: granteeId, source_user_id: sourceId, status: 'rejected' };
}

/** Ends `granteeId`'s link from the source's side (see decidableLink): its grants end at once. */
export async function endLinkAsSource(
  c: Container,
  actorId: string,
  granteeId: string,
  meta: RequestMeta,
): Promise<{ grantee_user_id: string; source_user_id: string; revoked_keys: number }> {
  const done = await c.db.transaction(async (trx) => {
    const link = await decidableLink(c, trx, actorId, granteeId, 'team_links.end', meta);
    const reason = link.source_id === actorId ? 'ended_by_source' : 'ended_by_admin';
    const revoked = await endLink(trx, link, reason, meta);
    await recordAudit(
      trx,
      { user_id: actorId, action: 'team_links.end', status: 'success', target: granteeId, details: { reason, source_user_id: link.source_id, revoked } },
      meta,
    );
    return { grantee_user_id: granteeId, source_user_id: link.source_id, revoked_keys: revoked, reason };
  });
  const { reason, ...out } = done;
  for (const who of new Set([granteeId, done.source_user_id, actorId]))
    await emitEvent(c, who, 'team_links.unlinked', { grantee_user_id: granteeId, source_user_id: done.source_user_id, reason });
  return out;
}

/**
 * In a password reset's transaction: links approved at or after `since` by one of `approvers` (the
 * account, and admins it brought in then), and links the account itself requested since, go back to
 * awaiting approval; their grants end at once. Audited for each party. Answers the links as they were;
 * the caller runs resyncGrantees once committed.
 */
export async function withdrawRecentApprovals(
  trx: Knex.Transaction,
  q: { accountId: string; approvers: string[]; since: Date; at: Date },
  meta: RequestMeta,
): Promise<TeamLinkRow[]> {
  const links = await lockRecentlyApprovedLinks(trx, { granteeId: q.accountId, approvers: q.approvers, since: q.since });
  for (const link of links) {
    const revoked = await deleteGrantsOfGrantee(trx, link.grantee_id);
    for (const who of new Set([q.accountId, link.grantee_id, link.source_id])) {
      await recordAudit(
        trx,
        {
          user_id: who,
          action: 'team_links.withdraw_approval',
          status: 'success',
          target: link.grantee_id,
          details: { grantee_user_id: link.grantee_id, source_user_id: link.source_id, approved_by: link.approved_by, revoked, reason: 'password_reset' },
        },
        meta,
      );
    }
  }
  await withdrawApprovals(
    trx,
    links.map((l) => l.grantee_id),
    q.at,
  );
  return links;
}

/** After links changed in a committed transaction: their grantees' syncs are queued (a failure is logged). */
export async function resyncGrantees(c: Container, granteeIds: string[], meta?: Partial<RequestMeta>): Promise<void> {
  for (const grantee of new Set(granteeIds)) {
    await enqueueSync(c, grantee, meta).catch((err: unknown) => c.log.warn({ err }, 'could not queue a team access re-sync'));
  }
}

/**
 * The owner of a reset account keeps a link the reset sent back to awaiting approval: the approval it had
 * is given again (by `approvedBy`, who gave it), if the link still joins the same grantee and source.
 * `changed`: it no longer does (ended, or linked elsewhere); `unchanged`: approved again since.
 */
export async function restoreApproval(
  trx: Knex.Transaction,
  actorId: string,
  link: { grantee_id: string; source_id: string; approved_by: string | null },
  at: Date,
  meta: RequestMeta,
): Promise<'restored' | 'unchanged' | 'changed'> {
  const now = await lockTeamLinkOfGrantee(trx, link.grantee_id);
  if (now?.source_id !== link.source_id) return 'changed';
  if (now.approved_at) return 'unchanged';
  const approvedBy = link.approved_by ?? actorId;
  await approveTeamLink(trx, link.grantee_id, approvedBy, at);
  for (const who of new Set([actorId, link.grantee_id, link.source_id])) {
    await recordAudit(
      trx,
      {
        user_id: who,
        action: 'team_links.approve',
        status: 'success',
        target: link.grantee_id,
        details: { grantee_user_id: link.grantee_id, source_user_id: link.source_id, approved_by: approvedBy, reason: 'recovery_review', by: actorId },
      },
      meta,
    );
  }
  return 'restored';
}

/** The owner of a reset account removes such a link: it ends with its grants (false when it had already ended or changed). */
export async function endReviewedLink(
  trx: Knex.Transaction,
  actorId: string,
  link: { grantee_id: string; source_id: string },
  meta: RequestMeta,
): Promise<boolean> {
  const now = await lockTeamLinkOfGrantee(trx, link.grantee_id);
  if (now?.source_id !== link.source_id) return false;
  const revoked = await endLink(trx, now, 'recovery_review', meta);
  await recordAudit(
    trx,
    {
      user_id: actorId,
      action: 'team_links.end',
      status: 'success',
      target: link.grantee_id,
      details: { reason: 'recovery_review', source_user_id: link.source_id, revoked },
    },
    meta,
  );
  return true;
}

/** After endReviewedLink committed: both sides hear of it. */
export async function afterReviewedLinkEnded(c: Container, link: { grantee_id: string; source_id: string }): Promise<void> {
  for (const who of new Set([link.grantee_id, link.source_id]))
    await emitEvent(c, who, 'team_links.unlinked', { grantee_user_id: link.grantee_id, source_user_id: link.source_id, reason: 'recovery_review' });
}

export interface SyncOutcome {
  linked: boolean;
  state?: SyncState;
  source_user_id?: string;
  inherited_keys: number;
  added: string[];
  removed: string[];
}

/**
 * One sync run for one grantee: the full grant set computed from the link in one transaction (the link
 * row locked, so runs for the same grantee take turns): grants that should not exist are deleted, the
 * missing ones inserted. A crash anywhere rolls the transaction back, and the next run computes the same
 * set from the same state. Wanted: the source's own lineages that are not disabled (expired ones stay,
 * shown as expired: expiry passes with time and a rotation revives them), while the link is approved
 * and the source is a live member of the grantee's organization; otherwise none (a link awaiting
 * approval syncs to none, state `ok`; without an eligible source, none and the state says `failed` /
 * `source_unavailable`).
 */
export async function syncGrants(c: Container, granteeId: string, origin: Origin): Promise<SyncOutcome> {
  await setTeamLinkState(c.db, granteeId, { state: 'running', updated_at: c.clock.now() });
  const now = c.clock.now();
  const outcome = await c.db.transaction(async (trx): Promise<SyncOutcome> => {
    const link = await lockTeamLinkOfGrantee(trx, granteeId);
    if (!link) return { linked: false, inherited_keys: 0, added: [], removed: await deleteGrantedLineages(trx, granteeId) };
    const grantee = await membershipOf(trx, granteeId);
    const source = await accountOrganization(trx, link.source_id);
    const eligible = Boolean(grantee && source?.organization_id && grantee.organization_id === source.organization_id);
    // One hop: lineages the source owns, never the ones it inherits itself; none until the link is approved.
    const wanted = eligible && link.approved_at ? await enabledLineageIds(trx, link.source_id) : [];
    const removed = await deleteUnwantedGrants(trx, granteeId, link.source_id, wanted);
    const added = await grantLineages(trx, granteeId, link.source_id, wanted, now);
    const state: SyncState = eligible ? 'ok' : 'failed';
    const lastError = eligible ? null : 'source_unavailable';
    await setTeamLinkState(trx, granteeId, { state, last_error: lastError, last_synced_at: now, updated_at: now });
    if (added.length || removed.length || link.last_error !== lastError) {
      await recordAudit(
        trx,
        {
          user_id: granteeId,
          action: 'team_links.sync',
          status: eligible ? 'success' : 'failure',
          target: link.source_id,
          details: { added: added.length, removed: removed.length, inherited_keys: wanted.length, ...(lastError ? { reason: lastError } : {}) },
        },
        origin,
      );
    }
    return { linked: true, state, source_user_id: link.source_id, inherited_keys: wanted.length, added, removed };
  });
  if (outcome.linked) {
    await emitEvent(c, granteeId, 'team_links.synced', {
      source_user_id: outcome.source_user_id,
      state: outcome.state,
      inherited_keys: outcome.inherited_keys,
      added: outcome.added.length,
      removed: outcome.removed.length,
    });
  }
  return outcome;
}

/** The last try of a sync failed: the status says so (the grants are what the last good run left). */
export async function markSyncFailed(c: Container, granteeId: string, code: string): Promise<void> {
  await setTeamLinkState(c.db, granteeId, { state: 'failed', last_error: code, updated_at: c.clock.now() });
}

/** For key lists: the owner (id, username) of each inherited lineage, by lineage id. */
export async function inheritedOwners(
  c: Container,
  userId: string,
  lineages: Pick<LineageRow, 'id' | 'user_id'>[],
): Promise<Map<string, { user_id: string; username: string }>> {
  const foreign = lineages.filter((l) => l.user_id !== userId);
  if (!foreign.length) return new Map();
  const users = await usersByIds(
    c.db,
    foreign.map((l) => l.user_id),
  );
  const names = new Map(users.map((u) => [u.id, u.username]));
  return new Map(foreign.map((l) => [l.id, { user_id: l.user_id, username: names.get(l.user_id) ?? '' }]));
}
