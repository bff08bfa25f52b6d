import type { Knex } from 'knex';
import type { Container } from '../container';
import { newToken, hashToken } from '../tokens';
import { findActivePartnerKey, insertPartnerKey, retirePartnerKeys, type PartnerKeyRow } from '../../db/partner-keys';
import { lockAccount } from '../../db/users';
import { recordAudit, type RequestMeta } from '../../db/audit';

/** Partner keys look like `kms_pk_<43 base64url chars>`: 256 random bits behind a prefix scanners recognise. */
export const PARTNER_KEY_PREFIX = 'kms_pk_';

export interface IssuedKey {
  /** The only time the full key exists outside the caller's hands. */
  value: string;
  row: PartnerKeyRow;
}

/** Retires the account's live key (if any) and issues the next; run inside the caller's transaction. */
export async function issuePartnerKey(trx: Knex.Transaction, userId: string, now: Date, ttlDays: number): Promise<IssuedKey> {
  // Serialise rotations of one account: concurrent ones would both retire, then race on the insert.
  await lockAccount(trx, userId);
  await retirePartnerKeys(trx, userId, 'rotated', now);
  const value = newToken(PARTNER_KEY_PREFIX);
  const row = await insertPartnerKey(trx, {
    user_id: userId,
    prefix: value.slice(0, PARTNER_KEY_PREFIX.length + 6),
    key_hash: hashToken(value),
    expires_at: new Date(now.getTime() + ttlDays * 86400_000),
  });
  return { value, row };
}

/** Status of the account's current partner key (never its value): GET /partners/api-key-status and GET /profile/api-key. */
export async function currentPartnerKeyStatus(c: Container, userId: string) {
  await c.usage.flush(); // last use as of this request
  return partnerKeyStatus(await findActivePartnerKey(c.db, userId), c.clock.now());
}

function partnerKeyStatus(row: PartnerKeyRow | undefined, now: Date) {
  if (!row) return { status: 'none' as const, prefix: null, created_at: null, expires_at: null, last_used_at: null, days_remaining: null };
  const expired = row.expires_at <= now;
  return {
    status: expired ? ('expired' as const) : row.status,
    prefix: row.prefix,
    created_at: row.created_at.toISOString(),
    expires_at: row.expires_at.toISOString(),
    last_used_at: row.last_used_at?.toISOString() ?? null,
    days_remaining: expired ? 0 : Math.ceil((row.expires_at.getTime() - now.getTime()) / 86400_000),
  };
}

/** A new partner key for the account, the old one retired at once, audited together (`via`: how the caller signed in). */
export function rotatePartnerKey(c: Container, userId: string, via: string, meta: RequestMeta): Promise<IssuedKey> {
  return c.db.transaction(async (trx) => {
    const issued = await issuePartnerKey(trx, userId, c.clock.now(), c.config.partnerKeyTtlDays);
    await recordAudit(
      trx,
      { user_id: userId, action: 'partners.rotate_api_key', status: 'success', target: issued.row.id, details: { prefix: issued.row.prefix, via } },
      meta,
    );
    return issued;
  });
}
