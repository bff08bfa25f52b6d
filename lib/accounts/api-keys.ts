import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { enforcePlanLimit } from '../billing/subscriptions';
import type { Container } from '../container';
import { conflict, idempotencyKeyReused, invalidFields } from '../errors';
import { emitEvent } from '../events';
import { type NewEvent } from '../event-stream';
import { hashToken } from '../tokens';
import { checkManagedKey, displayPrefix, newManagedKey } from '../api-key-format';
import type { Scope } from '../auth/scopes';
import { notYours } from '../auth/ownership';
import { recordAudit, type RequestMeta } from '../../db/audit';
import { revokeActiveShares } from '../../db/share-links';
import {
  findApiKey,
  findApiKeyByIdempotencyKey,
  lockApiKey,
  insertApiKey,
  insertApiKeySecret,
  retireApiKeySecret,
  setApiKeyValue,
  markApiKeyRevoked,
  countUnrevoked,
  revokeKeysOfAccount,
  findCredentialByHash,
  pageApiKeys,
  type ApiKeyCredential,
  type ApiKeyRow,
  type ApiKeyState,
} from '../../db/api-keys';
import { lockAccount } from '../../db/users';

/**
 * Managed API keys: several per account, each with scopes and an optional expiry. A value is stored
 * twice: as a SHA-256 (authentication looks it up) and sealed under the master key (the owner can read
 * it again, and a share link can hand it out). Rotation makes a new value; the old one keeps working for
 * a grace period the caller chooses (Stripe's roll, Unkey's reroll). Revocation is immediate and
 * forgets the sealed value.
 */

/** Unrevoked keys per account: each is a credential to keep track of; 50 is plenty for services and CI. */
export const MAX_API_KEYS = 50;

/** The longest expiry a key can be given (expires_in_days has the same bound); no expiry at all is allowed. */
export const MAX_LIFETIME_DAYS = 3650;

export const valueAad = (keyId: string, secretId: string) => `api-key-value:${keyId}:${secretId}`;

export function apiKeyState(row: Pick<ApiKeyRow, 'revoked_at' | 'expires_at'>, now: Date): ApiKeyState {
  if (row.revoked_at) return 'revoked';
  if (row.expires_at && row.expires_at <= now) return 'expired';
  return 'active';
}

/**
 * The key's current value in plaintext, opened from its sealed copy; null once the key is revoked.
 * For whoever hands values out (GET /api-keys/{key_id}, API-key share links): the caller checks
 * ownership and records the read.
 */
export function currentApiKeyValue(c: Container, row: Pick<ApiKeyRow, 'id' | 'current_secret_id' | 'value_sealed' | 'revoked_at'>): string | null {
  if (row.revoked_at || !row.value_sealed) return null;
  return c.sealer.openText(row.value_sealed, valueAad(row.id, row.current_secret_id));
}

/** The caller's key, or 404 (audited as not_owner when it is another account's). */
export async function ownApiKey(c: Container, userId: string, id: string, meta?: RequestMeta): Promise<ApiKeyRow> {
  const row = await findApiKey(c.db, id);
  if (row?.user_id === userId) return row;
  throw await notYours(c, { userId, resource: 'api_key', target: id, existsElsewhere: Boolean(row), meta });
}

export interface NewApiKey {
  name: string;
  scopes: Scope[];
  expires_at?: Date;
  expires_in_days?: number;
}

function expiryOf(c: Container, input: NewApiKey): Date | null {
  const now = c.clock.now();
  if (input.expires_in_days !== undefined) return new Date(now.getTime() + input.expires_in_days * 86400_000);
  if (input.expires_at === undefined) return null;
  if (input.expires_at <= now) throw invalidFields([{ path: 'body.expires_at', message: 'must be in the future' }]);
  if (input.expires_at.getTime() > now.getTime() + MAX_LIFETIME_DAYS * 86400_000) {
    throw invalidFields([{ path: 'body.expires_at', message: `must be within ${MAX_LIFETIME_DAYS} days` }]);
  }
  return input.expires_at;
}

/** The client's Idempotency-Key of a generation and the hash of its request (lib/jobs/job-records.ts requestHash). */
export interface Idempotency {
  key: string;
  hash: string;
}

/**
 * A new key; its value is in the answer and can be read again with GET /api-keys/{key_id}. With an
 * Idempotency-Key, the same request again answers the key it made (`replayed`), with its value as it
 * is now (unsealed as a read is; null once revoked), and the same key with another request is refused.
 */
export async function generateApiKey(
  c: Container,
  userId: string,
  input: NewApiKey,
  meta: RequestMeta,
  idempotency?: Idempotency,
): Promise<{ row: ApiKeyRow; value: string | null; replayed: boolean }> {
  const id = randomUUID();
  const secretId = randomUUID();
  const value = newManagedKey();
  const now = c.clock.now();
  const made = await c.db.transaction(async (trx) => {
    // One account's creations are serialised so that concurrent requests cannot pass the limit together
    // (nor make two keys for one Idempotency-Key).
    await lockAccount(trx, userId);
    const earlier = idempotency && (await findApiKeyByIdempotencyKey(trx, userId, idempotency.key));
    if (earlier) {
      if (earlier.request_hash !== idempotency.hash) throw idempotencyKeyReused();
      return { row: earlier, replayed: true };
    }
    const expires = expiryOf(c, input);
    await enforcePlanLimit(c, trx, userId, 'api_keys');
    if ((await countUnrevoked(trx, userId)) >= MAX_API_KEYS)
      throw conflict('api_key_limit_reached', `An account has at most ${MAX_API_KEYS} unrevoked API keys; revoke one first.`);
    const inserted = await insertApiKey(trx, {
      id,
      user_id: userId,
      name: input.name,
      prefix: displayPrefix(value),
      scopes: input.scopes,
      value_sealed: c.sealer.seal(value, valueAad(id, secretId)),
      current_secret_id: secretId,
      expires_at: expires,
      created_at: now,
      updated_at: now,
      idempotency_key: idempotency?.key ?? null,
      request_hash: idempotency?.hash ?? null,
    });
    await insertApiKeySecret(trx, { id: secretId, key_id: id, key_hash: hashToken(value), prefix: displayPrefix(value), created_at: now });
    await recordAudit(
      trx,
      {
        user_id: userId,
        action: 'api_keys.create',
        status: 'success',
        target: id,
        details: { name: input.name, prefix: displayPrefix(value), scopes: input.scopes, expires_at: expires?.toISOString() ?? null },
      },
      meta,
    );
    return { row: inserted, replayed: false };
  });
  if (made.replayed) {
    const current = currentApiKeyValue(c, made.row);
    if (current !== null)
      await recordAudit(
        c.db,
        { user_id: userId, action: 'api_keys.read_value', status: 'success', target: made.row.id, details: { prefix: made.row.prefix } },
        meta,
      );
    return { row: made.row, value: current, replayed: true };
  }
  await emitEvent(c, userId, 'api_keys.created', { key_id: id, scopes: input.scopes, expires_at: made.row.expires_at?.toISOString() ?? null });
  return { row: made.row, value, replayed: false };
}

/** The account's keys; this process's uncounted requests are written first, so a caller sees its own use. */
export async function listApiKeys(c: Container, userId: string, q: { state?: ApiKeyState; page: number; pageSize: number }) {
  await c.usage.flush();
  return pageApiKeys(c.db, userId, { ...q, now: c.clock.now() });
}

/** The key with its value (null once revoked); every read of a value is audited. */
export async function readApiKey(c: Container, userId: string, id: string, meta: RequestMeta): Promise<{ row: ApiKeyRow; value: string | null }> {
  const row = await ownApiKey(c, userId, id, meta);
  const value = currentApiKeyValue(c, row);
  if (value !== null)
    await recordAudit(c.db, { user_id: userId, action: 'api_keys.read_value', status: 'success', target: id, details: { prefix: row.prefix } }, meta);
  return { row, value };
}

/**
 * A new value for the key (same id, name, scopes, expiry and counters). The value it replaces keeps
 * working until `now + graceMs` (0: at once), then answers 401 `api_key_rotated`. Values replaced by
 * earlier rotations keep their own ends.
 */
export async function rotateApiKey(
  c: Container,
  userId: string,
  id: string,
  graceMs: number,
  meta: RequestMeta,
): Promise<{ row: ApiKeyRow; value: string; previousValueExpiresAt: Date }> {
  const value = newManagedKey();
  const secretId = randomUUID();
  const now = c.clock.now();
  const previousEnd = new Date(now.getTime() + graceMs);
  const row = await c.db.transaction(async (trx) => {
    const key = await lockApiKey(trx, id);
    if (key?.user_id !== userId) throw await notYours(c, { userId, resource: 'api_key', target: id, existsElsewhere: Boolean(key), meta });
    const state = apiKeyState(key, now);
    if (state !== 'active')
      throw conflict(
        `api_key_${state}`,
        `The API key is ${state}; ${state === 'revoked' ? 'generate a new one' : 'generate a new one (expiry does not change on rotation)'}.`,
      );
    await retireApiKeySecret(trx, key.current_secret_id, now, previousEnd);
    await insertApiKeySecret(trx, { id: secretId, key_id: id, key_hash: hashToken(value), prefix: displayPrefix(value), created_at: now });
    const updated = await setApiKeyValue(trx, id, {
      prefix: displayPrefix(value),
      value_sealed: c.sealer.seal(value, valueAad(id, secretId)),
      current_secret_id: secretId,
      last_rotated_at: now,
      previous_value_expires_at: previousEnd,
      updated_at: now,
    });
    await recordAudit(
      trx,
      {
        user_id: userId,
        action: 'api_keys.rotate',
        status: 'success',
        target: id,
        details: { previous_prefix: key.prefix, prefix: displayPrefix(value), grace_seconds: Math.round(graceMs / 1000) },
      },
      meta,
    );
    return updated;
  });
  await emitEvent(c, userId, 'api_keys.rotated', { key_id: id, previous_value_expires_at: previousEnd.toISOString() });
  return { row, value, previousValueExpiresAt: previousEnd };
}

/** Revokes every value of the key at once and forgets the sealed one; repeating it changes nothing. */
export async function revokeApiKey(c: Container, userId: string, id: string, meta: RequestMeta): Promise<void> {
  const now = c.clock.now();
  const revoked = await c.db.transaction(async (trx) => {
    const key = await lockApiKey(trx, id);
    if (key?.user_id !== userId) throw await notYours(c, { userId, resource: 'api_key', target: id, existsElsewhere: Boolean(key), meta });
    if (key.revoked_at) return false;
    await markApiKeyRevoked(trx, id, now);
    await recordAudit(trx, { user_id: userId, action: 'api_keys.revoke', status: 'success', target: id, details: { prefix: key.prefix } }, meta);
    return true;
  });
  if (revoked) await emitEvent(c, userId, 'api_keys.revoked', { key_id: id });
}

/**
 * Revokes every key of the account and every live share link of them, audited per key and per link in
 * the caller's transaction (a password reset ends them all); answers the events to publish once it commits.
 */
export async function revokeAllApiKeys(
  trx: Knex.Transaction,
  userId: string,
  now: Date,
  reason: string,
  meta: RequestMeta,
): Promise<{ keys: number; shares: number; events: NewEvent[] }> {
  const keys = await revokeKeysOfAccount(trx, userId, now);
  const links = await revokeActiveShares(trx, { userId, kind: 'api_key', now });
  const entry = { user_id: userId, status: 'success' as const };
  for (const k of keys) await recordAudit(trx, { ...entry, action: 'api_keys.revoke', target: k.id, details: { prefix: k.prefix, reason } }, meta);
  for (const l of links)
    await recordAudit(
      trx,
      { ...entry, action: 'api_key_shares.revoke', target: l.id, details: { kind: 'api_key', target_id: l.target_id, view_count: l.view_count, reason } },
      meta,
    );
  const events: NewEvent[] = [
    ...keys.map((k): NewEvent => ({ type: 'api_keys.revoked', data: { key_id: k.id } })),
    ...links.map((l): NewEvent => ({
      type: 'share_links.revoked',
      data: { share_id: l.id, kind: 'api_key', target_id: l.target_id, view_count: l.view_count },
    })),
  ];
  return { keys: keys.length, shares: links.length, events };
}

export type ApiKeyCheck =
  | { ok: true; credential: ApiKeyCredential }
  | { ok: false; code: 'invalid_api_key' | 'api_key_revoked' | 'api_key_expired' | 'api_key_rotated'; credential?: ApiKeyCredential };

/**
 * Authenticates a presented managed key value: shape and checksum first (no I/O: a mistyped or
 * invented key never reaches the database), then one indexed lookup of its hash with its key and
 * account. Whether it is revoked, expired or rotated past its grace is told apart so clients can act.
 */
export async function verifyApiKey(c: Container, value: string, now: Date): Promise<ApiKeyCheck> {
  if (checkManagedKey(value) !== 'ok') return { ok: false, code: 'invalid_api_key' };
  const credential = await findCredentialByHash(c.db, hashToken(value));
  if (!credential) return { ok: false, code: 'invalid_api_key' };
  if (credential.revoked_at) return { ok: false, code: 'api_key_revoked', credential };
  if (credential.expires_at && credential.expires_at <= now) return { ok: false, code: 'api_key_expired', credential };
  if (credential.rotated_at && (!credential.valid_until || credential.valid_until <= now)) return { ok: false, code: 'api_key_rotated', credential };
  return { ok: true, credential };
}

/** Counts an authenticated request against the key (requests and last use; written within a second). */
export const recordApiKeyUse = (c: Container, keyId: string, now: Date) => c.usage.record('api_key', keyId, now);
