import type { Knex } from 'knex';
import { newestFirstPage } from './knex';

export interface PasskeyRow {
  id: string;
  user_id: string;
  credential_id: string;
  public_key: Buffer;
  /** bigint column: pg answers a string; `passkeys()` rows go through `toRow`. */
  counter: number;
  transports: string[];
  device_type: 'singleDevice' | 'multiDevice';
  backed_up: boolean;
  aaguid: string;
  name: string;
  active: boolean;
  last_used_at: Date | null;
  created_at: Date;
  updated_at: Date;
}

type Stored = Omit<PasskeyRow, 'counter'> & { counter: string | number };
const toRow = (r: Stored): PasskeyRow => ({ ...r, counter: Number(r.counter) });
const table = (db: Knex) => db<Stored>('passkeys');

export async function insertPasskey(
  db: Knex,
  row: Pick<PasskeyRow, 'user_id' | 'credential_id' | 'public_key' | 'counter' | 'transports' | 'device_type' | 'backed_up' | 'aaguid' | 'name'>,
): Promise<PasskeyRow> {
  const [inserted] = await table(db).insert(row).returning('*');
  return toRow(inserted);
}

export async function findPasskeyByCredentialId(db: Knex, credentialId: string): Promise<PasskeyRow | undefined> {
  const row = await table(db).where({ credential_id: credentialId }).first();
  return row && toRow(row);
}

export async function findPasskey(db: Knex, id: string): Promise<PasskeyRow | undefined> {
  const row = await table(db).where({ id }).first();
  return row && toRow(row);
}

/** Credential ids (and transports) of an account's passkeys; `activeOnly` for login, all for excludeCredentials. */
export async function credentialsOf(db: Knex, userId: string, activeOnly: boolean): Promise<Pick<PasskeyRow, 'credential_id' | 'transports'>[]> {
  const q = table(db).where({ user_id: userId }).select('credential_id', 'transports').orderBy('created_at');
  return activeOnly ? q.andWhere({ active: true }) : q;
}

export async function countPasskeys(db: Knex, userId: string): Promise<number> {
  const [row] = await table(db).where({ user_id: userId }).count<{ count: string }[]>({ count: '*' });
  return Number(row?.count ?? 0);
}

export async function pagePasskeys(db: Knex, userId: string, q: { page: number; pageSize: number }): Promise<{ items: PasskeyRow[]; total: number }> {
  const base = table(db).where({ user_id: userId });
  const { items, total } = await newestFirstPage<Stored>(base, q);
  return { items: items.map(toRow), total };
}

/** Changes one account's passkey; undefined when it is gone (deleted meanwhile) or not the account's. */
export async function updatePasskey(
  db: Knex,
  userId: string,
  id: string,
  patch: Partial<Pick<PasskeyRow, 'name' | 'active'>>,
  at: Date,
): Promise<PasskeyRow | undefined> {
  const [row] = await table(db)
    .where({ id, user_id: userId })
    .update({ ...patch, updated_at: at })
    .returning('*');
  return row && toRow(row);
}

/** Makes every active passkey of the account inactive (the owner can make them active again); answers them. */
export const deactivatePasskeys = async (trx: Knex.Transaction, userId: string, at: Date): Promise<Pick<PasskeyRow, 'id' | 'name'>[]> =>
  table(trx).where({ user_id: userId, active: true }).update({ active: false, updated_at: at }).returning(['id', 'name']);

export const deletePasskey = async (db: Knex, userId: string, id: string): Promise<number> => table(db).where({ id, user_id: userId }).delete();

/**
 * Moves the signature counter forward and records the use, only if the counter still allows it: a
 * stored counter at or above the new one (two uses of one assertion, or a cloned authenticator) updates
 * nothing. Authenticators without a counter send 0 every time; that stays allowed while both are 0.
 */
export async function advanceCounter(db: Knex, id: string, counter: number, backedUp: boolean, at: Date): Promise<boolean> {
  const n = await table(db)
    .where({ id, active: true })
    .andWhere((q) => {
      if (counter === 0) q.where('counter', 0);
      else q.where('counter', '<', counter);
    })
    .update({ counter, backed_up: backedUp, last_used_at: at, updated_at: at });
  return n === 1;
}
