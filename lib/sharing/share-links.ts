import { randomUUID } from 'node:crypto';
import { enforcePlanLimit } from '../billing/subscriptions';
import type { Knex } from 'knex';
import type { Container } from '../container';
import { AppError, gone, invalid, notFound } from '../errors';
import { consume } from '../auth/limiters';
import { emitEvent } from '../events';
import { hashToken, newToken } from '../tokens';
import { userAgentClass } from '../user-agent';
import { notYours } from '../auth/ownership';
import { recordAudit, type RequestMeta } from '../../db/audit';
import {
  UA_CLASSES,
  SHARE_STATES,
  findByTokenHash,
  pageShares,
  purgeViewsBefore,
  shareAnalytics as queryAnalytics,
  insertShare,
  lockShare,
  markShareRevoked,
  recordShareView,
  takeView,
  type ShareKind,
  type ShareRow,
  type ShareState,
} from '../../db/share-links';

/**
 * Share links, the one mechanism behind public key shares (`/keys/share/...`) and managed API key
 * shares (`/api-keys/.../share...`). A share is a row pointing at one target of its kind (a key lineage,
 * an API key); a kind's routes add only what is particular to their target: how to check it and what a
 * view answers (the `resolve` of `viewShare`).
 *
 * - Token: the kind's prefix + 256 random bits (base64url), answered by `createShare` and stored as its
 *   SHA-256 for lookup and sealed (AES-GCM under the master key, bound to the share id) for the owner's
 *   lists, which give an active share's link back. A view looks the token up by the hash, never
 *   comparing plaintext, so the lookup reveals nothing through timing about any stored token.
 * - State (active, expired, revoked, exhausted) is computed from the row and `c.clock`, never stored.
 * - A view is one atomic UPDATE that counts it only while the share is usable, so parallel views never
 *   pass a view limit; the kind's `resolve` runs in the same transaction and a refusal there (the key is
 *   disabled) gives the view back.
 * - Recipient addresses are personal data and are shown back to the owner: sealed (AES-GCM under the
 *   master key, bound to the share id), not hashed.
 * - Events: share_links.created and share_links.revoked once per change; share_links.viewed on the 1st, 10th, 100th, ...
 *   view of a share (an order-of-magnitude signal, not one event per view). Audit rows for create and
 *   revoke (`<kind audit prefix>.created|revoked`); views are recorded in share_link_views (time, client
 *   class), not in the audit log, which a public link could otherwise flood.
 */

export type { ShareKind, ShareRow, ShareState } from '../../db/share-links';

interface KindInfo {
  /** Token prefix: tells a scanner (and a reader of a leaked URL) what the token opens. */
  prefix: string;
  /** The resource its audit actions name (`<resource>s.create`, `.revoke`, `.deny_access`). */
  audit: 'key_share' | 'api_key_share';
}

const SHARE_KIND_INFO: Record<ShareKind, KindInfo> = {
  public_key: { prefix: 'kms_ks_', audit: 'key_share' },
  api_key: { prefix: 'kms_as_', audit: 'api_key_share' },
};

const TOKEN_BODY = /^[A-Za-z0-9_-]{43}$/;
export const recipientAad = (shareId: string) => `share-recipient:${shareId}`;
export const shareTokenAad = (shareId: string) => `share-token:${shareId}`;

/** Whether `token` has the shape of a token of this kind (a lookup is pointless otherwise). */
const isShareToken = (kind: ShareKind, token: string) =>
  token.startsWith(SHARE_KIND_INFO[kind].prefix) && TOKEN_BODY.test(token.slice(SHARE_KIND_INFO[kind].prefix.length));

function shareState(row: Pick<ShareRow, 'revoked_at' | 'expires_at' | 'view_limit' | 'view_count'>, now: Date): ShareState {
  if (row.revoked_at) return 'revoked';
  if (row.expires_at && row.expires_at <= now) return 'expired';
  if (row.view_limit !== null && row.view_count >= row.view_limit) return 'exhausted';
  return 'active';
}

/**
 * A share as its owner sees it (never the token's hash). The token itself, unsealed, only while the
 * share is active: a link that no longer opens is not handed out again. Null for rows made before
 * tokens were kept sealed.
 */
export function shareOut(c: Container, row: ShareRow) {
  const state = shareState(row, c.clock.now());
  return {
    share_id: row.id,
    kind: row.kind,
    target_id: row.target_id,
    state,
    share_token: state === 'active' && row.token_sealed ? c.sealer.openText(row.token_sealed, shareTokenAad(row.id)) : null,
    expires_at: row.expires_at?.toISOString() ?? null,
    max_views: row.view_limit,
    view_count: row.view_count,
    views_remaining: row.view_limit === null ? null : Math.max(0, row.view_limit - row.view_count),
    last_viewed_at: row.last_viewed_at?.toISOString() ?? null,
    revoked_at: row.revoked_at?.toISOString() ?? null,
    recipient_email: row.recipient_sealed ? c.sealer.openText(row.recipient_sealed, recipientAad(row.id)) : null,
    created_at: row.created_at.toISOString(),
  };
}

export interface NewShare {
  kind: ShareKind;
  userId: string;
  targetId: string;
  /** Null: until revoked. Must be in the future. */
  expiresAt: Date | null;
  /** Null: no limit. */
  maxViews: number | null;
  recipientEmail?: string | null;
  /** Non-secret facts about the target (ids, fingerprints) for the audit row and the share_links.created event. */
  details?: Record<string, unknown>;
}

/** Creates a share; the token is answered here once (only its hash is stored). Audited; emits share_links.created. */
export async function createShare(c: Container, input: NewShare, meta: RequestMeta): Promise<{ share: ShareRow; token: string }> {
  const now = c.clock.now();
  if (input.expiresAt && input.expiresAt <= now)
    throw invalid('validation_failed', 'The expiry must be in the future.', [{ path: 'body.expires_at', message: 'must be in the future' }]);
  if (input.maxViews !== null && (!Number.isInteger(input.maxViews) || input.maxViews < 1))
    throw invalid('validation_failed', 'The view limit must be a positive integer.', [{ path: 'body.max_views', message: 'must be at least 1' }]);
  const id = randomUUID();
  const token = newToken(SHARE_KIND_INFO[input.kind].prefix);
  const share = await c.db.transaction(async (trx) => {
    await enforcePlanLimit(c, trx, input.userId, 'shares');
    const row = await insertShare(trx, {
      id,
      kind: input.kind,
      user_id: input.userId,
      target_id: input.targetId,
      token_hash: hashToken(token),
      token_sealed: c.sealer.seal(token, shareTokenAad(id)),
      expires_at: input.expiresAt,
      view_limit: input.maxViews,
      recipient_sealed: input.recipientEmail ? c.sealer.seal(input.recipientEmail, recipientAad(id)) : null,
      created_at: now,
    });
    await recordAudit(
      trx,
      {
        user_id: input.userId,
        action: `${SHARE_KIND_INFO[input.kind].audit}s.create`,
        status: 'success',
        target: id,
        details: {
          ...input.details,
          kind: input.kind,
          target_id: input.targetId,
          expires_at: input.expiresAt?.toISOString() ?? null,
          max_views: input.maxViews,
          recipient: Boolean(input.recipientEmail),
        },
      },
      meta,
    );
    return row;
  });
  await emitEvent(c, input.userId, 'share_links.created', {
    ...input.details,
    share_id: id,
    kind: input.kind,
    target_id: input.targetId,
    expires_at: input.expiresAt?.toISOString() ?? null,
    max_views: input.maxViews,
  });
  return { share, token };
}

const shareNotFound = () => notFound('share_not_found', 'No such share in your account.');

/**
 * Revokes a share at once: the caller's own, or one `mayRevoke` allows (the key's owner revoking a
 * teammate's share of her key); its maker is then audited and told too. Repeating it is harmless: a
 * share already revoked is answered as it is, with no second audit row or event (`changed` says which
 * happened).
 */
export async function revokeShare(
  c: Container,
  userId: string,
  kind: ShareKind,
  id: string,
  meta: RequestMeta,
  mayRevoke: (row: ShareRow, trx: Knex.Transaction) => Promise<boolean> = async () => false,
): Promise<{ share: ShareRow; changed: boolean }> {
  const now = c.clock.now();
  const result = await c.db.transaction(async (trx) => {
    const row = await lockShare(trx, id);
    if (!row || row.kind !== kind || (row.user_id !== userId && !(await mayRevoke(row, trx)))) {
      throw await notYours(
        c,
        { userId, resource: SHARE_KIND_INFO[kind].audit, target: id, existsElsewhere: Boolean(row && row.user_id !== userId), meta },
        shareNotFound(),
      );
    }
    if (row.revoked_at) return { share: row, changed: false };
    const updated = await markShareRevoked(trx, id, now);
    for (const who of new Set([userId, row.user_id])) {
      await recordAudit(
        trx,
        {
          user_id: who,
          action: `${SHARE_KIND_INFO[kind].audit}s.revoke`,
          status: 'success',
          target: id,
          details: { kind, target_id: row.target_id, view_count: row.view_count, revoked_by: userId },
        },
        meta,
      );
    }
    return { share: updated, changed: true };
  });
  if (result.changed) {
    for (const who of new Set([userId, result.share.user_id])) {
      await emitEvent(c, who, 'share_links.revoked', { share_id: id, kind, target_id: result.share.target_id, view_count: result.share.view_count });
    }
  }
  return result;
}

/** The caller's shares of one kind (and, with `alsoOfOwnKeys`, those of its own key lineages), newest first; optionally of one target and in one state. */
export function listShares(
  c: Container,
  q: { userId: string; kind: ShareKind; alsoOfOwnKeys?: boolean; targetId?: string; state?: ShareState; page: number; pageSize: number },
) {
  return pageShares(c.db, { ...q, now: c.clock.now() });
}

type ViewRefusal = 'unknown' | 'revoked' | 'expired' | 'exhausted';

/** The HTTP answer to a refused view: unknown 404; revoked, expired, used up 410. */
function refusalError(reason: ViewRefusal): AppError {
  switch (reason) {
    case 'unknown':
      return notFound('share_not_found', 'No share has this token.');
    case 'revoked':
      return gone('share_revoked', 'This share link was revoked.');
    case 'expired':
      return gone('share_expired', 'This share link has expired.');
    case 'exhausted':
      return gone('share_exhausted', 'This share link has been used as many times as it allows.');
  }
}

export interface ViewRequest<T> {
  kind: ShareKind;
  token: string;
  /** The viewer's request: the per-address budget is spent before the token is looked up. */
  meta: RequestMeta;
  userAgent?: string;
  /**
   * What the view answers, read in the view's transaction once the view is taken: check the target
   * and throw (e.g. 410 `key_disabled`) to refuse; the view is then given back.
   */
  resolve(share: ShareRow, trx: Knex.Transaction): Promise<T>;
}

type ViewOutcome<T> = { ok: true; share: ShareRow; value: T } | { ok: false; reason: ViewRefusal };

/**
 * One view of a share by its token: spends the caller's per-address point first (429 when spent), then
 * takes the view atomically and records it (time, client class) for analytics. Answers the share (its
 * `view_count` including this view) and what `resolve` made, or why the share cannot be viewed.
 */
async function consumeView<T>(c: Container, req: ViewRequest<T>): Promise<ViewOutcome<T>> {
  await consume(c.limiters.shareView, req.meta.ip, 'Too many share-link views from this address; try again in a minute.');
  if (!isShareToken(req.kind, req.token)) return { ok: false, reason: 'unknown' };
  const tokenHash = hashToken(req.token);
  const now = c.clock.now();
  const taken = await c.db.transaction(async (trx) => {
    const share = await takeView(trx, { kind: req.kind, tokenHash, now });
    if (!share) return null;
    await recordShareView(trx, { share_id: share.id, viewed_at: now, ua_class: userAgentClass(req.userAgent) });
    return { share, value: await req.resolve(share, trx) };
  });
  if (!taken) {
    const row = await findByTokenHash(c.db, req.kind, tokenHash);
    if (!row) return { ok: false, reason: 'unknown' };
    if (row.owner_deleted) return { ok: false, reason: 'revoked' };
    const state = shareState(row, now);
    // A share that looks active here was used up between the two queries (or its last view was given back).
    return { ok: false, reason: state === 'active' ? 'exhausted' : state };
  }
  // Sampled: the first view and each power of ten, so a popular link does not flood the stream and webhooks.
  if (/^10*$/.test(String(taken.share.view_count))) {
    await emitEvent(c, taken.share.user_id, 'share_links.viewed', {
      share_id: taken.share.id,
      kind: req.kind,
      target_id: taken.share.target_id,
      view_count: taken.share.view_count,
    });
  }
  return { ok: true, ...taken };
}

/** consumeView that throws the refusal as its HTTP error (404 or 410). */
export async function viewShare<T>(c: Container, req: ViewRequest<T>): Promise<{ share: ShareRow; value: T }> {
  const outcome = await consumeView(c, req);
  if (!outcome.ok) throw refusalError(outcome.reason);
  return outcome;
}

/**
 * A share by its token without taking a view (a page that offers to reveal a secret, which browsers and
 * link previewers fetch on their own): spends the caller's per-address point as a view does, then
 * answers the share while it is usable, or throws why it is not (404 or 410).
 */
export async function peekShare(c: Container, req: { kind: ShareKind; token: string; meta: RequestMeta }): Promise<ShareRow> {
  await consume(c.limiters.shareView, req.meta.ip, 'Too many share-link views from this address; try again in a minute.');
  if (!isShareToken(req.kind, req.token)) throw refusalError('unknown');
  const row = await findByTokenHash(c.db, req.kind, hashToken(req.token));
  if (!row) throw refusalError('unknown');
  if (row.owner_deleted) throw refusalError('revoked');
  const state = shareState(row, c.clock.now());
  if (state !== 'active') throw refusalError(state);
  return row;
}

const DAY_MS = 86_400_000;

/**
 * One account's share analytics for one kind: shares and their views by state, views per UTC day over
 * the last `days` days (every day listed, zeros included), the most viewed targets, the latest views.
 */
export async function shareAnalytics(c: Container, userId: string, kind: ShareKind, opts: { days?: number; top?: number; recent?: number } = {}) {
  const days = opts.days ?? 30;
  const now = c.clock.now();
  const today = Math.floor(now.getTime() / DAY_MS) * DAY_MS;
  const since = new Date(today - (days - 1) * DAY_MS);
  const a = await queryAnalytics(c.db, { userId, kind, now, since, top: opts.top ?? 10, recent: opts.recent ?? 20 });
  const totals = { active: 0, expired: 0, revoked: 0, exhausted: 0 };
  const viewsByState = { ...totals };
  for (const s of a.byState) {
    totals[s.state] = s.shares;
    viewsByState[s.state] = s.views;
  }
  const perDay = new Map(a.byDay.map((d) => [d.day, d.views]));
  const byDay = Array.from({ length: days }, (_, i) => {
    const day = new Date(since.getTime() + i * DAY_MS).toISOString().slice(0, 10);
    return { day, views: perDay.get(day) ?? 0 };
  });
  return {
    totals: { ...totals, shares: Object.values(totals).reduce((x, y) => x + y, 0), views: Object.values(viewsByState).reduce((x, y) => x + y, 0) },
    views_by_state: viewsByState,
    views_by_day: byDay,
    top_targets: a.topTargets,
    recent_views: a.recent.map((v) => ({ viewed_at: v.viewed_at.toISOString(), share_id: v.share_id, target_id: v.target_id, ua_class: v.ua_class })),
  };
}

/** Headers of every public share-link answer: a link is for its recipient, not for search engines or the pages it is opened from. */
export const SHARE_VIEW_HEADERS = { 'X-Robots-Tag': 'noindex, nofollow', 'Referrer-Policy': 'no-referrer' } as const;

/** View records are kept this long: analytics reads 30 days; each share's own count keeps the total. */
export const VIEW_RETENTION_DAYS = 90;

export function purgeShareViews(c: Container): Promise<number> {
  return purgeViewsBefore(c.db, new Date(c.clock.now().getTime() - VIEW_RETENTION_DAYS * DAY_MS));
}

/** The states a share can be listed by, and the client classes its views are counted under. */
export { SHARE_STATES, UA_CLASSES };
