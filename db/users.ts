import type { Knex } from 'knex';
import { columnsOf, prepared } from './knex';

export interface UserRow {
  id: string;
  username: string;
  email: string;
  company_name: string | null;
  password_hash: string;
  role: 'user' | 'admin';
  token_version: number;
  rotation_days: number | null;
  email_verified_at: Date | null;
  deleted_at: Date | null;
  created_at: Date;
  updated_at: Date;
}

const live = (db: Knex) => db<UserRow>('users').whereNull('deleted_at');

// Every authenticated request reads its account (the token version): a prepared statement.
const USER_COLUMNS = columnsOf<UserRow>({
  id: 1,
  username: 1,
  email: 1,
  company_name: 1,
  password_hash: 1,
  role: 1,
  token_version: 1,
  rotation_days: 1,
  email_verified_at: 1,
  deleted_at: 1,
  created_at: 1,
  updated_at: 1,
}).join(', ');
const userById = prepared<UserRow>('users_by_id', `SELECT ${USER_COLUMNS} FROM users WHERE id = :id AND deleted_at IS NULL`);
export const findUserById = async (db: Knex, id: string): Promise<UserRow | undefined> => (await userById(db, { id }))[0];

/** Login accepts a username or an email, both case-insensitive. */
export const findUserByLogin = async (db: Knex, identifier: string): Promise<UserRow | undefined> =>
  live(db)
    .where((q) => {
      q.whereRaw('lower(username) = lower(?)', [identifier]).orWhereRaw('lower(email) = lower(?)', [identifier]);
    })
    .first();

/**
 * Serialises one account's creations (keys, API keys, webhooks, partner keys, jobs) for the rest of the
 * transaction, so concurrent requests cannot pass a limit together. `no key update` (FOR NO KEY UPDATE)
 * waits only for the account's other creations, not for inserts that merely reference the account.
 */
export async function lockAccount(trx: Knex.Transaction, id: string, strength: 'update' | 'no key update' = 'update'): Promise<void> {
  await (strength === 'update' ? lockForUpdate : lockForNoKeyUpdate)(trx, { id });
}
const lockForUpdate = prepared<never>('lock_account', 'SELECT id FROM users WHERE id = :id FOR UPDATE');
const lockForNoKeyUpdate = prepared<never>('lock_account_no_key_update', 'SELECT id FROM users WHERE id = :id FOR NO KEY UPDATE');

/** The live account's row, locked for the rest of the transaction. */
export const lockLiveUser = async (trx: Knex.Transaction, id: string): Promise<UserRow | undefined> => live(trx).where({ id }).forUpdate().first();

export const findUserByEmail = async (db: Knex, email: string): Promise<UserRow | undefined> => live(db).whereRaw('lower(email) = lower(?)', [email]).first();

export async function insertUser(db: Knex, user: Pick<UserRow, 'username' | 'email' | 'company_name' | 'password_hash' | 'role'>): Promise<UserRow> {
  const [row] = await db<UserRow>('users').insert(user).returning('*');
  return row;
}

export async function updateUser(db: Knex, id: string, patch: Partial<Omit<UserRow, 'id' | 'created_at'>>): Promise<UserRow> {
  const [row] = await db<UserRow>('users')
    .where({ id })
    .update({ ...patch, updated_at: db.fn.now() as unknown as Date })
    .returning('*');
  return row;
}

/** Password change, reset and deletion bump the version, which every JWT must match. */
export async function bumpTokenVersion(db: Knex, id: string, patch: Partial<Pick<UserRow, 'password_hash'>> = {}): Promise<UserRow> {
  const [row] = await db<UserRow>('users')
    .where({ id })
    .update({ ...patch, token_version: db.raw('token_version + 1') as unknown as number, updated_at: db.fn.now() as unknown as Date })
    .returning('*');
  return row;
}

/**
 * Every account's version moves on by `step` at once (a restore: lib/operations/backup). The versions of
 * the restored rows are those of the backup's time; tokens issued after it, on the timeline the restore
 * undoes, carry versions up to that plus the revocations made since, so the step must outgrow those.
 */
export async function bumpAllTokenVersions(db: Knex, step: number): Promise<number> {
  return db<UserRow>('users').update({ token_version: db.raw('token_version + ?', [step]) as unknown as number });
}

/** Which unique index a 23505 violation came from: the API answers 409 with the field's name. */
export function duplicateField(err: unknown): 'username' | 'email' | null {
  const e = err as { code?: string; constraint?: string };
  if (e.code !== '23505') return null;
  if (e.constraint === 'users_username_unique') return 'username';
  if (e.constraint === 'users_email_unique') return 'email';
  return null;
}

export interface EmailChangeRow {
  id: string;
  user_id: string;
  new_email: string;
  token_hash: string;
  expires_at: Date;
  used_at: Date | null;
}

export const insertEmailChange = async (db: Knex, row: Pick<EmailChangeRow, 'user_id' | 'new_email' | 'token_hash' | 'expires_at'>): Promise<void> => {
  await db('email_changes').insert(row);
};

/** Locks the row so two concurrent confirmations of one token cannot both succeed. */
export const lockEmailChange = async (trx: Knex.Transaction, tokenHash: string): Promise<EmailChangeRow | undefined> =>
  trx<EmailChangeRow>('email_changes').where({ token_hash: tokenHash }).forUpdate().first();

/** Confirming one change voids the account's other outstanding requests. */
export const useEmailChanges = async (trx: Knex.Transaction, userId: string, at: Date): Promise<number> =>
  trx<EmailChangeRow>('email_changes').where({ user_id: userId }).whereNull('used_at').update({ used_at: at });

/** Confirming the address the account has voids its other confirmations of that address, and nothing else. */
export const useEmailVerifications = async (trx: Knex.Transaction, userId: string, email: string, at: Date): Promise<number> =>
  trx<EmailChangeRow>('email_changes').where({ user_id: userId, new_email: email }).whereNull('used_at').update({ used_at: at });

/** Accounts by id with their public names, deleted ones included (what they made still names them). */
export async function usersByIds(db: Knex, ids: string[]): Promise<Pick<UserRow, 'id' | 'username' | 'email' | 'deleted_at'>[]> {
  return ids.length
    ? db<UserRow>('users')
        .whereIn('id', [...new Set(ids)])
        .select('id', 'username', 'email', 'deleted_at')
    : [];
}

export interface ContactRequest {
  name: string;
  email: string;
  subject: string;
  message: string;
  user_id: string | null;
}

/** Stores a contact request; answers its id (the reference the sender is given). */
export async function insertContactRequest(db: Knex, request: ContactRequest): Promise<string> {
  const [row] = await db('contact_requests').insert(request).returning<{ id: string }[]>('id');
  return row.id;
}
