import type { Container } from '../container';
import { AppError, gone } from '../errors';
import { consume } from '../auth/limiters';
import { IntegrityError } from '../integrity';
import { notify } from '../notify';
import { encryptionTarget, keyStatus, requireKey } from '../keys/key-catalog';
import { verifiedKey, verifiedLineage } from '../keys/key-integrity';
import { createShare, listShares, revokeShare, shareAnalytics, shareOut, viewShare, type ShareRow, type ShareState } from './share-links';
import { recordAudit, type RequestMeta } from '../../db/audit';
import { keyTargets } from '../../db/share-links';
import { ownsLineage, lineageUsableBy, type KeyRow, type LineageRow } from '../../db/keys';
import { usersByIds } from '../../db/users';

/**
 * Public key shares: share links of kind `public_key` whose target is a key lineage, so a link always
 * serves the lineage's current generation (it follows rotations). Everything generic (tokens, expiry,
 * view limits, revocation, analytics) is lib/sharing/share-links.ts; this adds the key lookups, the
 * recipient's notice and the public key a view answers.
 */

/** The public address of a share link (what the notice carries and the creation answers once). */
export const keyShareUrl = (c: Container, token: string) => `${c.config.publicUrl}/api/v1/keys/share/${token}`;

type KeyTarget = { lineage: LineageRow; current: KeyRow };

type Maker = { user_id: string; username: string };

/** A share as its owner sees it, with the key it points at (its current fingerprint and label) and who made it. */
function keyShareOut(c: Container, row: ShareRow, target: KeyTarget | undefined, maker: Maker) {
  const { target_id, kind: _kind, ...rest } = shareOut(c, row);
  return {
    ...rest,
    url: rest.share_token === null ? null : keyShareUrl(c, rest.share_token),
    created_by: maker,
    lineage_id: target_id,
    fingerprint: target?.current.fingerprint ?? null,
    label: target?.lineage.label ?? null,
    // A disabled key's links answer 410 whatever their own state.
    key_status: target ? keyStatus(target.lineage, target.current, c.clock.now()) : null,
  };
}

export interface KeyShareInput {
  fingerprint: string;
  expiresAt: Date | null;
  maxViews: number | null;
  recipientEmail: string | null;
}

/**
 * Shares a key (named by any generation's fingerprint) through a new link. Only a key that may encrypt
 * is shared (409 `key_disabled` / `key_expired` otherwise, audited). With a recipient, a notice carrying
 * the link and the fingerprint goes through the `notify` queue; at most 30 notices per account per hour
 * (429), spent before anything is created.
 */
export async function createKeyShare(c: Container, owner: { id: string; username: string }, input: KeyShareInput, meta: RequestMeta) {
  const view = await requireKey(c, owner.id, input.fingerprint, meta, 'share');
  try {
    encryptionTarget(view, c.clock.now());
  } catch (err) {
    const reason = err instanceof AppError ? err.code : 'error';
    await recordAudit(c.db, { user_id: owner.id, action: 'key_shares.create', status: 'failure', target: view.current.fingerprint, details: { reason } }, meta);
    throw err;
  }
  if (input.recipientEmail)
    await consume(c.limiters.shareNotice, owner.id, 'Too many share notices from this account; try again later or share the link yourself.');
  const { share, token } = await createShare(
    c,
    {
      kind: 'public_key',
      userId: owner.id,
      targetId: view.lineage.id,
      expiresAt: input.expiresAt,
      maxViews: input.maxViews,
      recipientEmail: input.recipientEmail,
      details: { lineage_id: view.lineage.id, fingerprint: view.current.fingerprint },
    },
    meta,
  );
  const url = keyShareUrl(c, token);
  if (input.recipientEmail) {
    await notify(
      c,
      input.recipientEmail,
      'key-shared',
      {
        owner: owner.username,
        label: view.lineage.label,
        fingerprint: view.current.fingerprint.toUpperCase(),
        link: url,
        expires_at: input.expiresAt?.toISOString() ?? '',
        max_views: input.maxViews === null ? '' : String(input.maxViews),
      },
      meta.requestId,
    );
  }
  return { share: keyShareOut(c, share, view, { user_id: owner.id, username: owner.username }), token, url, notice_queued: Boolean(input.recipientEmail) };
}

/**
 * Public key shares the caller made, and every share of the caller's own keys whoever made it (a
 * teammate's, through team access), newest first; by key (any generation's fingerprint) and state.
 */
export async function listKeyShares(
  c: Container,
  userId: string,
  q: { fingerprint?: string; state?: ShareState; page: number; pageSize: number },
  meta: RequestMeta,
  /** Where the shares are read (a route's reader); the key named, whose refusal is audited, is looked up in `c`. */
  from: Container = c,
) {
  const targetId = q.fingerprint ? (await requireKey(c, userId, q.fingerprint, meta, 'read')).lineage.id : undefined;
  // Shares of the caller's own keys are its to see (and revoke) whoever made them.
  const { items, total } = await listShares(from, {
    userId,
    kind: 'public_key',
    alsoOfOwnKeys: true,
    targetId,
    state: q.state,
    page: q.page,
    pageSize: q.pageSize,
  });
  const targets = await keyTargets(
    from.db,
    items.map((s) => s.target_id),
  );
  const makers = new Map(
    (
      await usersByIds(
        from.db,
        items.map((s) => s.user_id),
      )
    ).map((u) => [u.id, { user_id: u.id, username: u.username }]),
  );
  return { items: items.map((s) => keyShareOut(c, s, targets.get(s.target_id), makers.get(s.user_id) ?? { user_id: s.user_id, username: '' })), total };
}

/** Revokes a public key share the caller made, or any share of the caller's own key (see revokeShare). */
export function revokeKeyShare(c: Container, userId: string, shareId: string, meta: RequestMeta) {
  return revokeShare(c, userId, 'public_key', shareId, meta, async (row, trx) => ownsLineage(trx, userId, row.target_id));
}

/**
 * One public view of a share: the lineage's current public key, verified against its row MAC (a key
 * changed in the database is a 500, never served). A disabled key's shares answer 410 `key_disabled`
 * and the view is not counted. Rate limited per client address; see viewShare.
 */
export async function viewKeyShare(c: Container, req: { token: string; userAgent?: string }, meta: RequestMeta) {
  const { share, value } = await viewShare(c, {
    kind: 'public_key',
    ...req,
    meta,
    async resolve(row, trx) {
      const target = (await keyTargets(trx, [row.target_id])).get(row.target_id);
      if (!target) throw gone('share_target_gone', 'The key this link shared no longer exists.');
      const lineage = verifiedLineage(c, target.lineage);
      const current = verifiedKey(c, target.current);
      // The MACs bind each row to its account; the generation must be its lineage's.
      if (current.user_id !== lineage.user_id) throw new IntegrityError(`share ${row.id} target`);
      // A teammate's share of an inherited key serves only while team access still grants it the key.
      if (lineage.user_id !== row.user_id && !(await lineageUsableBy(trx, row.user_id, lineage.id)))
        throw gone('share_access_revoked', 'The key was shared through team access, which has ended.');
      if (lineage.destroyed_at || lineage.destroy_after)
        throw gone('key_destroyed', 'The shared key was destroyed (or is scheduled for destruction) by its owner.');
      if (lineage.disabled_at) throw gone('key_disabled', 'The shared key was disabled by its owner.');
      return { lineage, current };
    },
  });
  const { lineage, current } = value;
  const now = c.clock.now();
  return {
    fingerprint: current.fingerprint,
    label: lineage.label,
    algorithm: current.algorithm,
    profile: current.profile,
    uid: `${lineage.uid_name} <${lineage.uid_email}>`,
    status: keyStatus(lineage, current, now) as 'active' | 'expired',
    generation: current.generation,
    expires_at: current.expires_at?.toISOString() ?? null,
    public_key: current.public_armored,
    share_expires_at: share.expires_at?.toISOString() ?? null,
    views_remaining: share.view_limit === null ? null : share.view_limit - share.view_count,
  };
}

/** Share analytics of the caller's public key shares, with each top key's current fingerprint and label. */
export async function keyShareAnalytics(c: Container, userId: string) {
  const a = await shareAnalytics(c, userId, 'public_key', { days: 30, top: 10, recent: 20 });
  const targets = await keyTargets(c.db, [...a.top_targets.map((t) => t.target_id), ...a.recent_views.map((v) => v.target_id)]);
  const about = (id: string) => ({ lineage_id: id, fingerprint: targets.get(id)?.current.fingerprint ?? null, label: targets.get(id)?.lineage.label ?? null });
  return {
    totals: a.totals,
    views_by_day: a.views_by_day,
    top_keys: a.top_targets.map((t) => ({ ...about(t.target_id), views: t.views, shares: t.shares })),
    recent_views: a.recent_views.map(({ target_id, ...v }) => ({ ...v, lineage_id: target_id })),
  };
}
