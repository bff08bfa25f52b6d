import type { Knex } from 'knex';

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

export const findActivePartnerKey = (db: Knex, userId: string) =>
  db<PartnerKeyRow>('partner_api_keys').where({ user_id: userId, status: 'active' }).first();

export const findPartnerKeyByHash = (db: Knex, keyHash: string) => db<PartnerKeyRow>('partner_api_keys').where({ key_hash: keyHash }).first();

export async function insertPartnerKey(db: Knex, row: Pick<PartnerKeyRow, 'user_id' | 'prefix' | 'key_hash' | 'expires_at'>): Promise<PartnerKeyRow> {
  const [inserted] = await db<PartnerKeyRow>('partner_api_keys').insert(row).returning('*');
  return inserted!;
}

/** Retires every live key of the account (rotation: 'rotated'; deletion: 'revoked'). */
export const retirePartnerKeys = (db: Knex, userId: string, status: 'rotated' | 'revoked', at: Date) =>
  db<PartnerKeyRow>('partner_api_keys').where({ user_id: userId, status: 'active' }).update({ status, revoked_at: at });

export const touchPartnerKey = (db: Knex, id: string, at: Date) =>
  db<PartnerKeyRow>('partner_api_keys').where({ id }).update({ last_used_at: db.raw('greatest(last_used_at, ?)', [at]) as unknown as Date });
