import type { Knex } from 'knex';
import { columnsOf, prepared } from './knex';

export interface PartnerKeyRow {
  id: string;
  user_id: string;
  prefix: string;
  key_hash: string;
  status: 'active' | 'rotated' | 'revoked';
  expires_at: Date;
  last_used_at: Date | null;
  revoked_at: Date | null;
  created_at: Date;
}

export const findActivePartnerKey = async (db: Knex, userId: string): Promise<PartnerKeyRow | undefined> =>
  db<PartnerKeyRow>('partner_api_keys').where({ user_id: userId, status: 'active' }).first();

// Every request authenticated by a partner key makes this lookup: a prepared statement.
const partnerKeyByHash = prepared<PartnerKeyRow>(
  'partner_key_by_hash',
  `SELECT ${columnsOf<PartnerKeyRow>({ id: 1, user_id: 1, prefix: 1, key_hash: 1, status: 1, expires_at: 1, last_used_at: 1, revoked_at: 1, created_at: 1 }).join(', ')}
   FROM partner_api_keys WHERE key_hash = :hash`,
);
export const findPartnerKeyByHash = async (db: Knex, keyHash: string): Promise<PartnerKeyRow | undefined> => (await partnerKeyByHash(db, { hash: keyHash }))[0];

export async function insertPartnerKey(db: Knex, row: Pick<PartnerKeyRow, 'user_id' | 'prefix' | 'key_hash' | 'expires_at'>): Promise<PartnerKeyRow> {
  const [inserted] = await db<PartnerKeyRow>('partner_api_keys').insert(row).returning('*');
  return inserted;
}

/** Retires every live key of the account (rotation: 'rotated'; deletion: 'revoked'). */
export const retirePartnerKeys = async (db: Knex, userId: string, status: 'rotated' | 'revoked', at: Date): Promise<number> =>
  db<PartnerKeyRow>('partner_api_keys').where({ user_id: userId, status: 'active' }).update({ status, revoked_at: at });

export const touchPartnerKey = async (db: Knex, id: string, at: Date): Promise<void> => {
  await db<PartnerKeyRow>('partner_api_keys')
    .where({ id })
    .update({ last_used_at: db.raw('greatest(last_used_at, ?)', [at]) as unknown as Date });
};
