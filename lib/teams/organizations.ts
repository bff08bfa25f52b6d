import type { Knex } from 'knex';
import type { Container } from '../container';
import { AppError, badRequest, conflict, forbidden, gone, notFound } from '../errors';
import { emitEvent } from '../events';
import { type EventType } from '../event-names';
import { consume } from '../auth/limiters';
import { hashToken, newToken } from '../tokens';
import { notify } from '../notify';
import { notYours } from '../auth/ownership';
import { isManager, outranks } from './org-roles';
import { afterDetach, detachMember, memberOut, type Detached } from './team-access';
import { recordAudit, type RequestMeta } from '../../db/audit';
import { findUserById, lockLiveUser } from '../../db/users';
import {
  memberWithEmail,
  heirOf,
  ensureMembership,
  membershipOf,
  pageMembers,
  managerIds,
  countMembers,
  findOrganization,
  lockOrganization,
  deleteOrganization,
  lockMember,
  deleteMember,
  insertMember,
  transferOwnership,
  countOpenInvitations,
  insertInvitation,
  pageInvitations,
  lockInvitation,
  lockInvitationByTokenHash,
  findInvitationByTokenHash,
  markInvitationRevoked,
  markInvitationAccepted,
  markInvitationUnrevoked,
  revokeOpenInvitationsBy,
  lockRecentInvitees,
  setMemberRole,
  type InviteeView,
  type InvitationRow,
  type MemberRow,
  type OrganizationRow,
} from '../../db/teams';
import type { AuditAction } from '../event-names';

/**
 * Organizations: every account belongs to one. It starts as the owner of its own one-member
 * organization; an owner or admin invites others by email (a single-use token, mailed through the
 * `notify` queue), lists the invitations and revokes them, and an invitee who accepts moves into the
 * inviter's organization. Team access
 * (lib/teams/team-access.ts) links members of one organization only.
 */

/** How long an invitation token is valid. */
const INVITATION_TTL_HOURS = 72;
/** Open (unused, unexpired) invitations per organization. */
const MAX_OPEN_INVITATIONS = 100;

function organizationOut(org: OrganizationRow, mine: MemberRow, count: number) {
  return {
    organization_id: org.id,
    name: org.name,
    owner_user_id: org.owner_id,
    role: mine.role,
    member_count: count,
    created_at: org.created_at.toISOString(),
  };
}

/** The caller's organization (made on first use for accounts that have none yet). */
export async function myOrganization(c: Container, userId: string) {
  const mine = await ensureMembership(c.db, userId);
  const org = (await findOrganization(c.db, mine.organization_id))!;
  return organizationOut(org, mine, await countMembers(c.db, org.id));
}

export async function listMembers(c: Container, userId: string, page: { page: number; pageSize: number }) {
  const mine = await ensureMembership(c.db, userId);
  const { items, total } = await pageMembers(c.db, { organizationId: mine.organization_id, page: page.page, pageSize: page.pageSize });
  return { items: items.map(memberOut), total };
}

/** Emits an organization event to its owner and admins (and to `also`, e.g. the member concerned). */
async function tellManagers(c: Container, organizationId: string, type: EventType, data: Record<string, unknown>, also: string[] = []): Promise<void> {
  const managers = await managerIds(c.db, organizationId);
  for (const id of new Set([...managers, ...also])) await emitEvent(c, id, type, data);
}

const failureAudit = (c: Container, userId: string, action: AuditAction, target: string | null, meta: RequestMeta, err: unknown) =>
  err instanceof AppError && err.status < 500
    ? recordAudit(c.db, { user_id: userId, action, status: 'failure', target, details: { reason: err.code } }, meta)
    : Promise.resolve();

/**
 * Invites an email address into the caller's organization (owners and admins only). The token goes
 * only into the mail; the answer and the database hold its hash. At most 30 invitation mails per
 * organization per hour (the point is spent before anything is created) and 100 open invitations.
 */
export async function invite(c: Container, inviter: { id: string }, input: { email: string; role: 'admin' | 'member' }, meta: RequestMeta) {
  const mine = await ensureMembership(c.db, inviter.id);
  try {
    if (!isManager(mine)) throw forbidden('organization_admin_required', 'Only the owner or an admin of the organization may invite.');
    if (input.role === 'admin' && mine.role !== 'owner') throw forbidden('organization_owner_required', 'Only the owner may invite admins.');
  } catch (err) {
    await failureAudit(c, inviter.id, 'organization_invitations.create', mine.organization_id, meta, err);
    throw err;
  }
  await consume(c.limiters.invitationMail, mine.organization_id, 'Too many invitations from this organization; try again later.');
  const token = newToken('kms_inv_');
  const now = c.clock.now();
  const { org, row } = await c.db.transaction(async (trx) => {
    // Serialises the organization's invitations, so parallel requests cannot pass the open limit together.
    const org = (await lockOrganization(trx, mine.organization_id))!;
    const already = await memberWithEmail(trx, org.id, input.email);
    if (already) throw conflict('already_member', 'An account with this email address is already a member.');
    if ((await countOpenInvitations(trx, org.id, now)) >= MAX_OPEN_INVITATIONS)
      throw conflict('invitation_limit_reached', `An organization has at most ${MAX_OPEN_INVITATIONS} open invitations.`);
    const row = await insertInvitation(trx, {
      organization_id: org.id,
      email: input.email,
      role: input.role,
      invited_by: inviter.id,
      token_hash: hashToken(token),
      expires_at: new Date(now.getTime() + INVITATION_TTL_HOURS * 3600_000),
      created_at: now,
    });
    await recordAudit(
      trx,
      {
        user_id: inviter.id,
        action: 'organization_invitations.create',
        status: 'success',
        target: row.id,
        details: { organization_id: org.id, role: input.role },
      },
      meta,
    );
    return { org, row: row };
  });
  const who = await findUserById(c.db, inviter.id);
  await notify(
    c,
    input.email,
    'organization-invite',
    { inviter: who?.username ?? '', organization: org.name, role: input.role, token, ttl_hours: String(INVITATION_TTL_HOURS) },
    meta.requestId,
  );
  return invitationOut(row, now);
}

export const INVITATION_STATES = ['pending', 'accepted', 'revoked', 'expired'] as const;
export type InvitationState = (typeof INVITATION_STATES)[number];

/** Computed from the row and the time, never stored: accepted or revoked for good, else expired once past expires_at. */
const invitationState = (row: Pick<InvitationRow, 'accepted_at' | 'revoked_at' | 'expires_at'>, now: Date): InvitationState =>
  row.accepted_at ? 'accepted' : row.revoked_at ? 'revoked' : row.expires_at <= now ? 'expired' : 'pending';

const invitationOut = (row: InvitationRow, now: Date) => ({
  invitation_id: row.id,
  organization_id: row.organization_id,
  email: row.email,
  role: row.role,
  state: invitationState(row, now),
  invited_by_user_id: row.invited_by,
  expires_at: row.expires_at.toISOString(),
  accepted_at: row.accepted_at?.toISOString() ?? null,
  revoked_at: row.revoked_at?.toISOString() ?? null,
  created_at: row.created_at.toISOString(),
});

/**
 * What an invitation's page shows before anyone signs in: the organization, who invited, the address
 * invited and until when. The token is the only credential, as for accepting; an unknown, used, revoked
 * or expired one is one 404 (nothing tells a guesser which). The caller spends a per-address point first.
 */
export async function lookUpInvitation(c: Container, token: string) {
  const now = c.clock.now();
  const inv = await findInvitationByTokenHash(c.db, hashToken(token));
  if (!inv || invitationState(inv, now) !== 'pending')
    throw notFound('invitation_not_found', 'This invitation is not valid: it may have expired, been used or been revoked.');
  const [org, inviter] = await Promise.all([findOrganization(c.db, inv.organization_id), inv.invited_by ? findUserById(c.db, inv.invited_by) : undefined]);
  if (!org) throw notFound('invitation_not_found', 'This invitation is not valid: it may have expired, been used or been revoked.');
  return {
    organization_name: org.name,
    invited_by: inviter && !inviter.deleted_at ? { username: inviter.username } : null,
    email: inv.email,
    role: inv.role,
    expires_at: inv.expires_at.toISOString(),
  };
}

/** The caller's organization's invitations, newest first, optionally in one state (owners and admins). */
export async function listInvitations(c: Container, userId: string, q: { state?: InvitationState; page: number; pageSize: number }) {
  const mine = await ensureMembership(c.db, userId);
  if (!isManager(mine)) throw forbidden('organization_admin_required', "Only the owner or an admin may list the organization's invitations.");
  const now = c.clock.now();
  const { items, total } = await pageInvitations(c.db, mine.organization_id, { ...q, now });
  return { items: items.map((r) => invitationOut(r, now)), total };
}

/**
 * Revokes an invitation of the caller's organization: its token no longer joins (410
 * `invitation_revoked`). Owners revoke any; admins those inviting plain members (only the owner
 * invites admins). An accepted invitation: 409 `invitation_used`; repeating a revocation is harmless.
 * Another organization's invitation, or an unknown id: 404 (audited as not_owner when it exists).
 */
export async function revokeInvitation(c: Container, actorId: string, invitationId: string, meta: RequestMeta): Promise<void> {
  const mine = await ensureMembership(c.db, actorId);
  const now = c.clock.now();
  try {
    await c.db.transaction(async (trx) => {
      const inv = await lockInvitation(trx, invitationId);
      if (inv?.organization_id !== mine.organization_id) {
        throw await notYours(
          c,
          { userId: actorId, resource: 'organization_invitation', target: invitationId, existsElsewhere: Boolean(inv), meta },
          notFound('invitation_not_found', 'No such invitation in your organization.'),
        );
      }
      if (!isManager(mine)) throw forbidden('organization_admin_required', 'Only the owner or an admin may revoke invitations.');
      if (!outranks(mine.role, inv.role)) throw forbidden('organization_owner_required', "Only the owner may revoke an admin's invitation.");
      if (inv.accepted_at) throw conflict('invitation_used', 'This invitation has already been accepted; remove the member instead.');
      if (inv.revoked_at) return;
      await markInvitationRevoked(trx, inv.id, actorId, now);
      await recordAudit(
        trx,
        {
          user_id: actorId,
          action: 'organization_invitations.revoke',
          status: 'success',
          target: inv.id,
          details: { organization_id: inv.organization_id, role: inv.role },
        },
        meta,
      );
    });
  } catch (err) {
    if (!(err instanceof AppError && err.status === 404)) await failureAudit(c, actorId, 'organization_invitations.revoke', invitationId, meta, err);
    throw err;
  }
}

/**
 * The signed-in invitee accepts with the mailed token: the invitation must be unused, unexpired and
 * addressed to the caller's email (403 otherwise; the token stays usable by its addressee). The caller
 * leaves its current organization: its own one-member organization is deleted; an owner whose
 * organization still has other members must remove them first (409). Leaving ends the caller's team
 * access link and the access others inherited from it (see detachMember).
 */
export async function acceptInvitation(c: Container, userId: string, token: string, meta: RequestMeta) {
  const now = c.clock.now();
  let result: { org: OrganizationRow; inv: InvitationRow; previous: MemberRow; detached: Detached };
  try {
    await ensureMembership(c.db, userId);
    result = await c.db.transaction(async (trx) => {
      const account = await lockLiveUser(trx, userId);
      if (!account) throw notFound('account_not_found', 'The account no longer exists.');
      const inv = await lockInvitationByTokenHash(trx, hashToken(token));
      if (!inv) throw badRequest('invalid_invitation_token', 'This invitation token is not valid.');
      if (inv.accepted_at) throw gone('invitation_used', 'This invitation has already been used.');
      if (inv.revoked_at) throw gone('invitation_revoked', 'This invitation was revoked; ask for a new one.');
      if (inv.expires_at <= now) throw gone('invitation_expired', 'This invitation has expired; ask for a new one.');
      if (inv.email.toLowerCase() !== account.email.toLowerCase())
        throw forbidden('invitation_wrong_account', 'This invitation was sent to another email address; accept it from the account with that address.');
      const previous = (await lockMember(trx, userId))!;
      if (previous.organization_id === inv.organization_id) throw conflict('already_member', 'You are already a member of this organization.');
      const org = (await lockOrganization(trx, inv.organization_id))!;
      if (previous.role === 'owner' && (await countMembers(trx, previous.organization_id)) > 1) {
        throw conflict('organization_not_empty', 'You own an organization with other members; remove them before joining another.');
      }
      const detached = await detachMember(trx, userId, now, 'joined_organization', meta);
      await deleteMember(trx, userId);
      if (previous.role === 'owner') await deleteOrganization(trx, previous.organization_id);
      await insertMember(trx, { user_id: userId, organization_id: org.id, role: inv.role, joined_at: now });
      await markInvitationAccepted(trx, inv.id, userId, now);
      await recordAudit(
        trx,
        {
          user_id: userId,
          action: 'organization_members.join',
          status: 'success',
          target: org.id,
          details: { invitation_id: inv.id, role: inv.role, previous_organization_id: previous.organization_id },
        },
        meta,
      );
      if (inv.invited_by)
        await recordAudit(
          trx,
          {
            user_id: inv.invited_by,
            action: 'organization_members.join',
            status: 'success',
            target: userId,
            details: { invitation_id: inv.id, organization_id: org.id },
          },
          meta,
        );
      return { org, inv, previous, detached };
    });
  } catch (err) {
    await failureAudit(c, userId, 'organization_invitations.accept', null, meta, err);
    throw err;
  }
  const { org, inv, previous, detached } = result;
  await afterDetach(c, userId, detached, 'joined_organization', meta);
  if (previous.role !== 'owner')
    await tellManagers(c, previous.organization_id, 'organization_members.removed', {
      organization_id: previous.organization_id,
      user_id: userId,
      reason: 'joined_organization',
    });
  await tellManagers(c, org.id, 'organization_members.joined', { organization_id: org.id, user_id: userId, role: inv.role }, [userId]);
  return myOrganization(c, userId);
}

/**
 * Takes a member out of the caller's organization: owners and admins remove others (never the owner);
 * any non-owner member may remove itself (leave). The member gets a new one-member organization of its
 * own; its team access link and inherited keys end, and so does what others inherited from it. Another
 * organization's member, or an unknown id, is 404 (audited as not_owner when the account exists).
 */
export async function removeMember(c: Container, actorId: string, targetId: string, meta: RequestMeta): Promise<void> {
  const mine = await ensureMembership(c.db, actorId);
  const now = c.clock.now();
  let detached: Detached;
  try {
    detached = await c.db.transaction((trx) => takeOutMember(c, trx, actorId, targetId, mine.organization_id, now, meta));
  } catch (err) {
    if (!(err instanceof AppError && err.status === 404)) await failureAudit(c, actorId, 'organization_members.remove', targetId, meta, err);
    throw err;
  }
  await afterTakenOut(c, actorId, targetId, mine.organization_id, detached, meta);
}

/** removeMember's change, in the caller's transaction: the checks, the departure and its audit rows. */
async function takeOutMember(
  c: Container,
  trx: Knex.Transaction,
  actorId: string,
  targetId: string,
  organizationId: string,
  now: Date,
  meta: RequestMeta,
): Promise<Detached> {
  await lockOrganization(trx, organizationId);
  const target = await lockMember(trx, targetId);
  const live = target && (await findUserById(trx, targetId));
  if (!target || !live || target.organization_id !== organizationId) {
    throw await notYours(
      c,
      { userId: actorId, resource: 'organization_member', target: targetId, existsElsewhere: Boolean(live), meta },
      notFound('member_not_found', 'No such member in your organization.'),
    );
  }
  const actor = await membershipOf(trx, actorId);
  if (target.role === 'owner') throw forbidden(targetId === actorId ? 'owner_cannot_leave' : 'owner_cannot_be_removed', 'The owner stays in the organization.');
  if (targetId !== actorId && !(actor?.organization_id === organizationId && isManager(actor)))
    throw forbidden('organization_admin_required', 'Only the owner or an admin may remove members.');
  if (targetId !== actorId && !outranks(actor!.role, target.role)) throw forbidden('organization_owner_required', 'Only the owner may remove an admin.');
  const d = await detachMember(trx, targetId, now, 'removed_from_organization', meta);
  await deleteMember(trx, targetId);
  await ensureMembership(trx, targetId);
  const reason = targetId === actorId ? 'left' : 'removed';
  await recordAudit(
    trx,
    { user_id: actorId, action: 'organization_members.remove', status: 'success', target: targetId, details: { organization_id: organizationId, reason } },
    meta,
  );
  if (targetId !== actorId)
    await recordAudit(
      trx,
      { user_id: targetId, action: 'organization_members.remove', status: 'success', target: organizationId, details: { by: actorId, reason } },
      meta,
    );
  return d;
}

/** After a member's removal committed: its links' ends are told, and the organization's managers hear of it. */
async function afterTakenOut(c: Container, actorId: string, targetId: string, organizationId: string, detached: Detached, meta: RequestMeta): Promise<void> {
  await afterDetach(c, targetId, detached, 'removed_from_organization', meta);
  await tellManagers(
    c,
    organizationId,
    'organization_members.removed',
    { organization_id: organizationId, user_id: targetId, reason: targetId === actorId ? 'left' : 'removed' },
    [targetId],
  );
}

/**
 * In a password reset's transaction: members who joined the account's organization in the review window
 * through an invitation it made. Admins among them become plain members (audited
 * `organization_members.change_role`), for the owner to make admins again on review; plain members are only
 * listed. Nothing else in the organization changes: removing someone is the owner's decision.
 */
export async function demoteRecentInvitees(
  trx: Knex.Transaction,
  accountId: string,
  since: Date,
  meta: RequestMeta,
): Promise<{ demoted: InviteeView[]; listed: InviteeView[] }> {
  const mine = await membershipOf(trx, accountId);
  if (!mine || !isManager(mine)) return { demoted: [], listed: [] };
  const invitees = await lockRecentInvitees(trx, accountId, mine.organization_id, since);
  const demoted = invitees.filter((m) => m.role === 'admin');
  for (const m of demoted) await changeRole(trx, accountId, m, 'member', 'password_reset', meta);
  return { demoted, listed: invitees.filter((m) => m.role === 'member') };
}

/** In a password reset's transaction: every open invitation these accounts made is revoked (audited for `by`). */
export async function revokeOpenInvitationsOf(trx: Knex.Transaction, inviterIds: string[], by: string, at: Date, meta: RequestMeta): Promise<InvitationRow[]> {
  const revoked = await revokeOpenInvitationsBy(trx, inviterIds, by, at);
  for (const inv of revoked)
    await recordAudit(
      trx,
      {
        user_id: by,
        action: 'organization_invitations.revoke',
        status: 'success',
        target: inv.id,
        details: { organization_id: inv.organization_id, role: inv.role, invited_by: inv.invited_by, reason: 'password_reset' },
      },
      meta,
    );
  return revoked;
}

/**
 * Keeping an invitation a reset revoked: its mailed token joins again, while it has not expired and the
 * actor still may revoke it (revokeInvitation's rule). `changed`: gone, expired, or no longer the actor's.
 */
export async function reopenInvitation(
  trx: Knex.Transaction,
  actorId: string,
  invitationId: string,
  at: Date,
  meta: RequestMeta,
): Promise<'reopened' | 'unchanged' | 'changed'> {
  const inv = await lockInvitation(trx, invitationId);
  const mine = await membershipOf(trx, actorId);
  if (!inv || !mine || inv.organization_id !== mine.organization_id || !isManager(mine) || !outranks(mine.role, inv.role)) return 'changed';
  if (!inv.revoked_at || inv.accepted_at) return 'unchanged';
  if (inv.expires_at <= at) return 'changed';
  await markInvitationUnrevoked(trx, inv.id);
  await recordAudit(
    trx,
    {
      user_id: actorId,
      action: 'organization_invitations.reopen',
      status: 'success',
      target: inv.id,
      details: { organization_id: inv.organization_id, role: inv.role, reason: 'recovery_review' },
    },
    meta,
  );
  return 'reopened';
}

/** Keeping an admin a reset made a plain member: admin again, by the organization's owner, if still a member. */
export async function restoreAdmin(
  trx: Knex.Transaction,
  actorId: string,
  memberId: string,
  organizationId: string,
  meta: RequestMeta,
): Promise<'restored' | 'unchanged' | 'changed'> {
  await lockOrganization(trx, organizationId);
  const member = await lockMember(trx, memberId);
  const actor = await membershipOf(trx, actorId);
  if (member?.organization_id !== organizationId) return 'changed';
  if (member.role !== 'member') return 'unchanged';
  if (actor?.organization_id !== organizationId || actor.role !== 'owner') throw forbidden('organization_owner_required', 'Only the owner makes admins.');
  await changeRole(trx, actorId, { user_id: memberId, organization_id: organizationId }, 'admin', 'recovery_review', meta);
  return 'restored';
}

/** A member's role between admin and member, audited `organization_members.change_role` for the actor and the member. */
async function changeRole(
  trx: Knex.Transaction,
  actorId: string,
  member: { user_id: string; organization_id: string },
  to: 'admin' | 'member',
  reason: string,
  meta: RequestMeta,
): Promise<void> {
  await setMemberRole(trx, member.user_id, to);
  const details = { organization_id: member.organization_id, from: to === 'admin' ? 'member' : 'admin', to, reason };
  await recordAudit(trx, { user_id: actorId, action: 'organization_members.change_role', status: 'success', target: member.user_id, details }, meta);
  await recordAudit(
    trx,
    { user_id: member.user_id, action: 'organization_members.change_role', status: 'success', target: member.organization_id, details },
    meta,
  );
}

/**
 * Removing a member listed on review: removeMember's change in the caller's transaction, if it is still
 * a member of that organization (undefined otherwise). The caller runs the answer's `after` once committed.
 */
export async function removeReviewedMember(
  c: Container,
  trx: Knex.Transaction,
  actorId: string,
  memberId: string,
  organizationId: string,
  meta: RequestMeta,
): Promise<{ after: () => Promise<void> } | undefined> {
  if ((await membershipOf(trx, memberId))?.organization_id !== organizationId) return undefined;
  const detached = await takeOutMember(c, trx, actorId, memberId, organizationId, c.clock.now(), meta);
  return { after: () => afterTakenOut(c, actorId, memberId, organizationId, detached, meta) };
}

/**
 * Account deletion, in its transaction: the account leaves its organization (see detachMember). An
 * owner hands the organization to its longest-standing admin, else its longest-standing member; an
 * organization left empty is deleted. The caller runs `afterAccountDeleted` once it has committed.
 */
export async function leaveOnDeletion(trx: Knex.Transaction, userId: string, at: Date, meta: RequestMeta): Promise<Detached> {
  const mine = await lockMember(trx, userId);
  const detached = await detachMember(trx, userId, at, 'account_deleted', meta);
  if (!mine) return detached;
  await deleteMember(trx, userId);
  if (mine.role === 'owner') {
    const heir = await heirOf(trx, mine.organization_id);
    if (!heir) await deleteOrganization(trx, mine.organization_id);
    else {
      await transferOwnership(trx, mine.organization_id, heir.user_id);
      await recordAudit(
        trx,
        { user_id: heir.user_id, action: 'organizations.change_owner', status: 'success', target: mine.organization_id, details: { reason: 'owner_deleted' } },
        meta,
      );
    }
  }
  return detached;
}

export const afterAccountDeleted = (c: Container, userId: string, detached: Detached, meta: RequestMeta) =>
  afterDetach(c, userId, detached, 'account_deleted', meta);
