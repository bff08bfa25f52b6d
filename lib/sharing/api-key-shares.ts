import type { Container } from '../container';
import { conflict, gone, invalid } from '../errors';
import { IntegrityError } from '../integrity';
import { apiKeyState, currentApiKeyValue, ownApiKey } from '../accounts/api-keys';
import { createShare, listShares, peekShare, shareOut, viewShare, type ShareRow, type ShareState } from './share-links';
import { recordAudit, type RequestMeta } from '../../db/audit';
import { findApiKey, shareLockApiKey, type ApiKeyRow } from '../../db/api-keys';

/**
 * Managed API key shares: share links of kind `api_key` (tokens `kms_as_…`) whose target is a managed
 * key, so a link hands out the key's *current* value (it follows rotations). A value is a secret, so
 * unlike public key shares every link has an expiry and a view limit (defaults: 24 hours, one view)
 * and each value handed out is audited for the owner. Tokens, expiry, limits, revocation and events are
 * lib/sharing/share-links.ts.
 */

/** The public address of a share link (answered once, at creation). */
const apiKeyShareUrl = (c: Container, token: string) => `${c.config.publicUrl}/api/v1/api-keys/shared/${token}`;

export const DEFAULT_SHARE_HOURS = 24;
/** A link to a secret is a hand-over, not a standing grant: at most 30 days and 100 views. */
export const MAX_SHARE_HOURS = 30 * 24;
export const MAX_SHARE_VIEWS = 100;

/** A share as the key's owner sees it, with the key it points at (never the token or the value). */
function apiKeyShareOut(c: Container, row: ShareRow, key: Pick<ApiKeyRow, 'name' | 'prefix' | 'revoked_at' | 'expires_at'>) {
  const { target_id, kind: _kind, recipient_email: _recipient, ...rest } = shareOut(c, row);
  return {
    ...rest,
    url: rest.share_token === null ? null : apiKeyShareUrl(c, rest.share_token),
    key_id: target_id,
    key_name: key.name,
    key_prefix: key.prefix,
    key_status: apiKeyState(key, c.clock.now()),
  };
}

/**
 * A new link to the key's value, expiring within MAX_SHARE_HOURS (a past expiry is refused by
 * createShare). Only an active key is shared: a revoked or expired one is 409 `api_key_revoked` /
 * `api_key_expired` (audited as a failed `api_key_shares.create`).
 */
export async function createApiKeyShare(c: Container, userId: string, keyId: string, input: { expiresAt: Date; maxViews: number }, meta: RequestMeta) {
  if (input.expiresAt.getTime() > c.clock.now().getTime() + MAX_SHARE_HOURS * 3_600_000) {
    throw invalid('validation_failed', 'The request body is invalid.', [{ path: 'body.expires_at', message: `must be within ${MAX_SHARE_HOURS} hours` }]);
  }
  const key = await ownApiKey(c, userId, keyId, meta);
  const state = apiKeyState(key, c.clock.now());
  if (state !== 'active') {
    await recordAudit(
      c.db,
      { user_id: userId, action: 'api_key_shares.create', status: 'failure', target: keyId, details: { reason: `api_key_${state}` } },
      meta,
    );
    throw conflict(`api_key_${state}`, `The API key is ${state}; it cannot be shared.`);
  }
  const { share, token } = await createShare(
    c,
    { kind: 'api_key', userId, targetId: key.id, expiresAt: input.expiresAt, maxViews: input.maxViews, details: { key_id: key.id, prefix: key.prefix } },
    meta,
  );
  return { share: apiKeyShareOut(c, share, key), token, url: apiKeyShareUrl(c, token) };
}

/** The shares of one of the caller's keys (404 for another account's key), newest first, by state. */
export async function listApiKeyShares(
  c: Container,
  userId: string,
  keyId: string,
  q: { state?: ShareState; page: number; pageSize: number },
  meta: RequestMeta,
  /** Where the shares are read (a route's reader); the key named, whose refusal is audited, is looked up in `c`. */
  from: Container = c,
) {
  const key = await ownApiKey(c, userId, keyId, meta);
  const { items, total } = await listShares(from, { userId, kind: 'api_key', targetId: key.id, state: q.state, page: q.page, pageSize: q.pageSize });
  return { items: items.map((s) => apiKeyShareOut(c, s, key)), total };
}

/**
 * One public view: the key's current value. The key row is read under a share lock in the view's
 * transaction, so a revocation or rotation committing at the same moment is either seen or waits for
 * this read; a revoked or expired key answers 410 `api_key_revoked` / `api_key_expired` and the view is
 * given back. The read is audited for the owner (never the value) in the same transaction.
 */
export async function viewApiKeyShare(c: Container, req: { token: string; userAgent?: string }, meta: RequestMeta) {
  const { share, value } = await viewShare(c, {
    kind: 'api_key',
    token: req.token,
    meta,
    userAgent: req.userAgent,
    async resolve(row, trx) {
      const key = await shareLockApiKey(trx, row.target_id);
      if (!key) throw gone('share_target_gone', 'The API key this link shared no longer exists.');
      if (key.user_id !== row.user_id) throw new IntegrityError(`share ${row.id} target`);
      const state = apiKeyState(key, c.clock.now());
      if (state !== 'active') throw gone(`api_key_${state}`, `The shared API key is ${state}.`);
      const plaintext = currentApiKeyValue(c, key);
      if (plaintext === null) throw gone('api_key_revoked', 'The shared API key is revoked.');
      await recordAudit(
        trx,
        {
          user_id: row.user_id,
          action: 'api_key_shares.read_value',
          status: 'success',
          target: key.id,
          details: { share_id: row.id, prefix: key.prefix, view_count: row.view_count },
        },
        meta,
      );
      return { key, plaintext };
    },
  });
  const { key, plaintext } = value;
  return {
    key_id: key.id,
    name: key.name,
    prefix: key.prefix,
    scopes: key.scopes,
    value: plaintext,
    expires_at: key.expires_at?.toISOString() ?? null,
    share_expires_at: share.expires_at?.toISOString() ?? null,
    views_remaining: share.view_limit === null ? null : Math.max(0, share.view_limit - share.view_count),
  };
}

/**
 * What a share's page shows before its value is revealed: the key's name and prefix and the share's
 * expiry and views left. No view is taken and nothing is audited (no value leaves); a share or key that
 * no longer hands out its value answers as a view would (404, 410).
 */
export async function peekApiKeyShare(c: Container, req: { token: string }, meta: RequestMeta) {
  const share = await peekShare(c, { kind: 'api_key', token: req.token, meta });
  const key = await findApiKey(c.db, share.target_id);
  if (!key || key.user_id !== share.user_id) throw gone('share_target_gone', 'The API key this link shared no longer exists.');
  const state = apiKeyState(key, c.clock.now());
  if (state !== 'active') throw gone(`api_key_${state}`, `The shared API key is ${state}.`);
  return {
    name: key.name,
    prefix: key.prefix,
    expires_at: key.expires_at?.toISOString() ?? null,
    share_expires_at: share.expires_at?.toISOString() ?? null,
    views_remaining: share.view_limit === null ? null : Math.max(0, share.view_limit - share.view_count),
  };
}
