import type { Knex } from 'knex';

export interface PasswordResetRow {
  id: string;
  user_id: string;
  token_hash: string;
  expires_at: Date;
  used_at: Date | null;
  created_at: Date;
}

export const insertPasswordReset = async (db: Knex, row: Pick<PasswordResetRow, 'user_id' | 'token_hash' | 'expires_at'>): Promise<void> => {
  await db('password_resets').insert(row);
};

/** Locks the row so two concurrent redemptions of one token cannot both succeed. */
export const lockPasswordReset = async (trx: Knex.Transaction, tokenHash: string): Promise<PasswordResetRow | undefined> =>
  trx<PasswordResetRow>('password_resets').where({ token_hash: tokenHash }).forUpdate().first();

/** Redeeming one token voids every other outstanding token of the account. */
export const usePasswordResets = async (trx: Knex.Transaction, userId: string, at: Date): Promise<number> =>
  trx<PasswordResetRow>('password_resets').where({ user_id: userId }).whereNull('used_at').update({ used_at: at });

/** Deletes tokens that expired before `cutoff`: how many went. */
export const purgePasswordResetsBefore = async (db: Knex, cutoff: Date): Promise<number> =>
  db<PasswordResetRow>('password_resets').where('expires_at', '<', cutoff).delete();
