import type { Knex } from 'knex';
import { z } from 'zod';
import type { Container } from '../container';
import { AppError, conflict, notFound } from '../errors';
import { notYours } from '../auth/ownership';
import { demoteRecentInvitees, removeReviewedMember, reopenInvitation, restoreAdmin, revokeOpenInvitationsOf } from '../teams/organizations';
import { afterReviewedLinkEnded, endReviewedLink, restoreApproval, resyncGrantees, withdrawRecentApprovals } from '../teams/team-access';
import { deleteReviewedEndpoint, endpointsChanged, pauseEndpointsChangedSince, resumePausedEndpoint } from '../webhooks/endpoints';
import { recordAudit, type RequestMeta } from '../../db/audit';
import { usersByIds } from '../../db/users';
import {
  findReviewItem,
  insertReviewItems,
  lockReviewItem,
  markReviewDecided,
  pageReviewItems,
  type NewReviewItem,
  type ReviewAction,
  type ReviewDecision,
  type ReviewItemRow,
  type ReviewKind,
} from '../../db/recovery-review';

/**
 * Review after recovery. A stolen session can give others access that outlives it: an invitation, an
 * approved team access link, a webhook that sends the account's events elsewhere. A password reset ends
 * every credential (lib/accounts/user-accounts.ts resetPassword) and, in the same transaction, undoes
 * what was granted in the RECOVERY_REVIEW_DAYS before it, listing each thing here: open invitations the
 * account made are revoked; links it approved or requested in that time go back to awaiting approval; its
 * webhooks made or changed in that time are paused; admins it brought into the organization in that time
 * become plain members, and the plain members it brought in are listed. The owner, signed in again, keeps
 * (restores) or removes each. What those admins did in that time is undone with the account's own: their
 * open invitations are revoked and the links they approved go back to awaiting approval.
 */

const DAY_MS = 86_400_000;

export const REVIEW_KINDS = ['invitation', 'team_link', 'webhook', 'member'] as const satisfies readonly ReviewKind[];
export const REVIEW_ACTIONS = ['revoked', 'returned_to_pending', 'paused', 'demoted', 'listed'] as const satisfies readonly ReviewAction[];
export const REVIEW_OUTCOMES = ['reopened', 'restored', 'resumed', 'unchanged', 'removed', 'already_gone'] as const;
type Outcome = (typeof REVIEW_OUTCOMES)[number];

/** What keeping restores, as the reset recorded it (ids and times only). */
const LinkDetails = z.object({ source_user_id: z.uuid(), approved_by: z.uuid().nullable() });
const MemberDetails = z.object({ organization_id: z.uuid() });

/** A webhook is named by its receiver's host (and description): its path and query may hold a token of the receiver's. */
function webhookLabel(url: string, description: string): string {
  let host: string;
  try {
    host = new URL(url).host;
  } catch {
    host = 'an endpoint';
  }
  return description ? `${host} (${description})` : host;
}

export interface Undone {
  items: NewReviewItem[];
  /** Once the reset committed: syncs of the links and the endpoint change announced. */
  after(): Promise<void>;
}

/** In the reset's transaction: undoes what was granted in the review window and lists it for review. */
export async function undoRecentGrants(c: Container, trx: Knex.Transaction, accountId: string, at: Date, meta: RequestMeta): Promise<Undone> {
  const since = new Date(at.getTime() - c.config.recoveryReviewDays * DAY_MS);
  const { demoted, listed } = await demoteRecentInvitees(trx, accountId, since, meta);
  const actors = [accountId, ...demoted.map((m) => m.user_id)];
  const invitations = await revokeOpenInvitationsOf(trx, actors, accountId, at, meta);
  const links = await withdrawRecentApprovals(trx, { accountId, approvers: actors, since, at }, meta);
  const hooks = await pauseEndpointsChangedSince(trx, accountId, since, at, meta);
  const people = new Map(
    (
      await usersByIds(
        trx,
        links.flatMap((l) => [l.grantee_id, l.source_id]),
      )
    ).map((u) => [u.id, u.id === accountId ? 'you' : u.email]),
  );
  const items: NewReviewItem[] = [
    ...demoted.map((m) => ({
      kind: 'member' as const,
      target_id: m.user_id,
      label: `${m.email} (invited as admin)`,
      action: 'demoted' as const,
      details: { organization_id: m.organization_id, invitation_id: m.invitation_id },
    })),
    ...listed.map((m) => ({
      kind: 'member' as const,
      target_id: m.user_id,
      label: `${m.email} (member)`,
      action: 'listed' as const,
      details: { organization_id: m.organization_id, invitation_id: m.invitation_id },
    })),
    ...invitations.map((inv) => ({
      kind: 'invitation' as const,
      target_id: inv.id,
      label: `${inv.email} (as ${inv.role})`,
      action: 'revoked' as const,
      details: { organization_id: inv.organization_id, role: inv.role },
    })),
    ...links.map((l) => ({
      kind: 'team_link' as const,
      target_id: l.grantee_id,
      label: `${people.get(l.grantee_id) ?? 'a deleted account'} inheriting the keys of ${people.get(l.source_id) ?? 'a deleted account'}`,
      action: 'returned_to_pending' as const,
      details: { source_user_id: l.source_id, approved_by: l.approved_by, approved_at: l.approved_at?.toISOString() ?? null },
    })),
    ...hooks.map((h) => ({ kind: 'webhook' as const, target_id: h.id, label: webhookLabel(h.url, h.description), action: 'paused' as const, details: {} })),
  ];
  await insertReviewItems(trx, accountId, at, items);
  return {
    items,
    async after() {
      await resyncGrantees(
        c,
        links.map((l) => l.grantee_id),
        meta,
      );
      if (hooks.length) await endpointsChanged(c, accountId);
    },
  };
}

const KIND_NAMES: Record<ReviewKind, string> = { invitation: 'invitation', team_link: 'team access link', webhook: 'webhook', member: 'member' };
const ACTION_NAMES: Record<ReviewAction, string> = {
  revoked: 'revoked',
  returned_to_pending: 'back to awaiting approval, its inherited keys withdrawn',
  paused: 'paused',
  demoted: 'made a plain member',
  listed: 'joined in that time (still a member)',
};

/** The lines of the reset's confirmation email: one per item, at most `max` and a count of the rest. */
export function reviewLines(items: NewReviewItem[], max = 20): string {
  const lines = items.slice(0, max).map((i) => `- ${KIND_NAMES[i.kind]} ${i.label}: ${ACTION_NAMES[i.action]}`);
  if (items.length > max) lines.push(`- and ${items.length - max} more`);
  return lines.join('\n');
}

const reviewItemOut = (row: ReviewItemRow) => ({
  item_id: row.id,
  kind: row.kind,
  target_id: row.target_id,
  label: row.label,
  action: row.action,
  done_at: row.created_at.toISOString(),
  decision: row.decision,
  decided_at: row.decided_at?.toISOString() ?? null,
});

export async function listReviewItems(c: Container, userId: string, q: { state?: 'open' | ReviewDecision; page: number; pageSize: number }) {
  const { items, total } = await pageReviewItems(c.db, userId, q);
  return { items: items.map(reviewItemOut), total };
}

interface Effect {
  outcome: Outcome | 'changed';
  after?: () => Promise<void>;
}

const restored = (outcome: 'reopened' | 'restored' | 'resumed' | 'unchanged' | 'changed', after?: () => Promise<void>): Effect =>
  outcome === 'reopened' || outcome === 'restored' || outcome === 'resumed' ? { outcome, after } : { outcome };

async function keep(c: Container, trx: Knex.Transaction, item: ReviewItemRow, at: Date, meta: RequestMeta): Promise<Effect> {
  const userId = item.user_id;
  switch (item.kind) {
    case 'invitation':
      return restored(await reopenInvitation(trx, userId, item.target_id, at, meta));
    case 'team_link': {
      const d = LinkDetails.parse(item.details);
      const link = { grantee_id: item.target_id, source_id: d.source_user_id, approved_by: d.approved_by };
      return restored(await restoreApproval(trx, userId, link, at, meta), () => resyncGrantees(c, [link.grantee_id], meta));
    }
    case 'webhook':
      return restored((await resumePausedEndpoint(trx, userId, item.target_id, at, meta)) ?? 'changed', () => endpointsChanged(c, userId));
    case 'member':
      if (item.action !== 'demoted') return { outcome: 'unchanged' };
      return restored(await restoreAdmin(trx, userId, item.target_id, MemberDetails.parse(item.details).organization_id, meta));
  }
}

async function remove(c: Container, trx: Knex.Transaction, item: ReviewItemRow, meta: RequestMeta): Promise<Effect> {
  const userId = item.user_id;
  switch (item.kind) {
    case 'invitation':
      // The reset revoked it; removing leaves it so.
      return { outcome: 'removed' };
    case 'team_link': {
      const link = { grantee_id: item.target_id, source_id: LinkDetails.parse(item.details).source_user_id };
      return (await endReviewedLink(trx, userId, link, meta))
        ? { outcome: 'removed', after: () => afterReviewedLinkEnded(c, link) }
        : { outcome: 'already_gone' };
    }
    case 'webhook':
      return (await deleteReviewedEndpoint(trx, userId, item.target_id, meta))
        ? { outcome: 'removed', after: () => endpointsChanged(c, userId) }
        : { outcome: 'already_gone' };
    case 'member': {
      const removed = await removeReviewedMember(c, trx, userId, item.target_id, MemberDetails.parse(item.details).organization_id, meta);
      return removed ? { outcome: 'removed', after: removed.after } : { outcome: 'already_gone' };
    }
  }
}

const CHANGED: Record<ReviewKind, string> = {
  invitation: 'The invitation has expired or left your hands since the reset; send a new one if you want it.',
  team_link: 'The team access link ended or points at another source since the reset; decide on it under team access.',
  webhook: 'The webhook endpoint was deleted since the reset.',
  member: 'The member left the organization since the reset.',
};

/**
 * Keeps (restores what the reset undid) or removes one item of the caller's review, once: another
 * account's item or an unknown id is 404 (audited when it exists), a decided one 409
 * `review_item_decided`, one whose thing changed since so that keeping cannot restore it 409
 * `review_target_changed` (the item stays open: removing it still works). Audited `recovery_review_items.keep`
 * or `recovery_review_items.remove`, with the effect.
 */
export async function decideReviewItem(c: Container, userId: string, itemId: string, decision: ReviewDecision, meta: RequestMeta) {
  const found = await findReviewItem(c.db, itemId);
  if (found?.user_id !== userId) {
    throw await notYours(
      c,
      { userId, resource: 'recovery_review_item', target: itemId, existsElsewhere: Boolean(found), meta },
      notFound('review_item_not_found', 'No such item in your review after recovery.'),
    );
  }
  const action = decision === 'kept' ? 'recovery_review_items.keep' : 'recovery_review_items.remove';
  const now = c.clock.now();
  try {
    const { row, outcome, after } = await c.db.transaction(async (trx) => {
      const item = (await lockReviewItem(trx, itemId))!;
      if (item.decision) throw conflict('review_item_decided', `This item was already ${item.decision}.`);
      const effect = decision === 'kept' ? await keep(c, trx, item, now, meta) : await remove(c, trx, item, meta);
      if (effect.outcome === 'changed') throw conflict('review_target_changed', CHANGED[item.kind]);
      const row = await markReviewDecided(trx, item.id, decision, now);
      await recordAudit(
        trx,
        { user_id: userId, action, status: 'success', target: item.id, details: { kind: item.kind, target_id: item.target_id, outcome: effect.outcome } },
        meta,
      );
      return { row, outcome: effect.outcome, after: effect.after };
    });
    await after?.();
    return { ...reviewItemOut(row), outcome };
  } catch (err) {
    if (err instanceof AppError && err.status < 500)
      await recordAudit(c.db, { user_id: userId, action, status: 'failure', target: itemId, details: { reason: err.code } }, meta);
    throw err;
  }
}
