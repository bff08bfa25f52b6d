import type { Knex } from 'knex';
import type { Scope } from '../lib/auth/scopes';
import { newestFirstPage, prepared, type Write } from './knex';

export interface ApiKeyRow {
  id: string;
  user_id: string;
  name: string;
  prefix: string;
  scopes: Scope[];
  value_sealed: string | null;
  current_secret_id: string;
  expires_at: Date | null;
  revoked_at: Date | null;
  last_rotated_at: Date | null;
  previous_value_expires_at: Date | null;
  last_used_at: Date | null;
  use_count: number;
  bytes_encrypted: number;
  bytes_decrypted: number;
  created_at: Date;
  updated_at: Date;
  /** The client's Idempotency-Key of the request that made the key, and that request's hash (requestHash). */
  idempotency_key: string | null;
  request_hash: string | null;
}

export interface ApiKeySecretRow {
  id: string;
  key_id: string;
  key_hash: string;
  prefix: string;
  rotated_at: Date | null;
  valid_until: Date | null;
  created_at: Date;
}

export type ApiKeyState = 'active' | 'expired' | 'revoked';

const apiKeys = (db: Knex) => db<ApiKeyRow>('api_keys');
const apiKeySecrets = (db: Knex) => db<ApiKeySecretRow>('api_key_secrets');

export const findApiKey = async (db: Knex, id: string): Promise<ApiKeyRow | undefined> => apiKeys(db).where({ id }).first();

/** The account's key made by a request with this Idempotency-Key, if any. */
export const findApiKeyByIdempotencyKey = async (db: Knex, userId: string, key: string): Promise<ApiKeyRow | undefined> =>
  apiKeys(db).where({ user_id: userId, idempotency_key: key }).first();

/** The key row, locked until the transaction ends. */
export const lockApiKey = async (trx: Knex.Transaction, id: string): Promise<ApiKeyRow | undefined> => apiKeys(trx).where({ id }).forUpdate().first();

/** The key row under a share lock: a revocation or rotation committing meanwhile waits for the transaction, or is seen. */
export const shareLockApiKey = async (trx: Knex.Transaction, id: string): Promise<ApiKeyRow | undefined> => apiKeys(trx).where({ id }).forShare().first();

export async function insertApiKey(
  trx: Knex.Transaction,
  row: Pick<ApiKeyRow, 'id' | 'user_id' | 'name' | 'prefix' | 'scopes' | 'value_sealed' | 'current_secret_id' | 'expires_at' | 'created_at' | 'updated_at'> &
    Partial<Pick<ApiKeyRow, 'idempotency_key' | 'request_hash'>>,
): Promise<ApiKeyRow> {
  const [inserted] = await apiKeys(trx).insert(row).returning('*');
  return inserted;
}

export const insertApiKeySecret = async (
  trx: Knex.Transaction,
  row: Pick<ApiKeySecretRow, 'id' | 'key_id' | 'key_hash' | 'prefix' | 'created_at'>,
): Promise<void> => {
  await apiKeySecrets(trx).insert(row);
};

/** A value replaced by rotation: it keeps working until `validUntil`. */
export const retireApiKeySecret = async (trx: Knex.Transaction, secretId: string, at: Date, validUntil: Date): Promise<void> => {
  await apiKeySecrets(trx).where({ id: secretId }).update({ rotated_at: at, valid_until: validUntil });
};

/** The key's new current value (a rotation); answers the key. */
export async function setApiKeyValue(
  trx: Knex.Transaction,
  id: string,
  value: Pick<ApiKeyRow, 'prefix' | 'value_sealed' | 'current_secret_id' | 'last_rotated_at' | 'previous_value_expires_at' | 'updated_at'>,
): Promise<ApiKeyRow> {
  const [updated] = await apiKeys(trx).where({ id }).update(value).returning('*');
  return updated;
}

/** Revokes the key and forgets its sealed value. */
export const markApiKeyRevoked = async (trx: Knex.Transaction, id: string, at: Date): Promise<void> => {
  await apiKeys(trx).where({ id }).update({ revoked_at: at, value_sealed: null, updated_at: at });
};

/** What authentication needs about a presented value, its key and its (live) account: one indexed lookup. */
export interface ApiKeyCredential {
  secret_id: string;
  rotated_at: Date | null;
  valid_until: Date | null;
  key_id: string;
  scopes: Scope[];
  expires_at: Date | null;
  revoked_at: Date | null;
  user_id: string;
  username: string;
  email: string;
  role: 'user' | 'admin';
}

// Every request authenticated by a managed API key makes this lookup: a prepared statement.
const credentialByHash = prepared<ApiKeyCredential>(
  'api_key_credential',
  `SELECT s.id AS secret_id, s.rotated_at, s.valid_until, k.id AS key_id, k.scopes, k.expires_at, k.revoked_at,
     u.id AS user_id, u.username, u.email, u.role
   FROM api_key_secrets s JOIN api_keys k ON k.id = s.key_id JOIN users u ON u.id = k.user_id
   WHERE s.key_hash = :hash AND u.deleted_at IS NULL`,
);
export async function findCredentialByHash(db: Knex, keyHash: string): Promise<ApiKeyCredential | undefined> {
  return (await credentialByHash(db, { hash: keyHash }))[0];
}

/** Adds `count` authenticated requests (lib/usage.ts batches them): a single-row UPDATE by primary key. */
export const addUse = async (db: Knex, keyId: string, count: number, last: Date): Promise<void> => {
  await apiKeys(db)
    .where({ id: keyId })
    .update({ use_count: db.raw('use_count + ?', [count]) as unknown as number, last_used_at: db.raw('greatest(last_used_at, ?)', [last]) as unknown as Date });
};

/** Adds a completed job's plaintext bytes to the key that submitted it (a write that lands with the job's completion: once). */
export const addJobBytes = (db: Knex, keyId: string, kind: 'encrypt' | 'decrypt', bytes: number): Write =>
  db<object>('api_keys')
    .where({ id: keyId })
    .increment(kind === 'encrypt' ? 'bytes_encrypted' : 'bytes_decrypted', bytes);

/** Narrows a query of `api_keys` to the keys in `state` at `now`. */
function whereState(q: Knex.QueryBuilder, state: ApiKeyState, now: Date): Knex.QueryBuilder {
  if (state === 'revoked') return q.whereNotNull('revoked_at');
  q.whereNull('revoked_at');
  return state === 'expired'
    ? q.where('expires_at', '<=', now)
    : q.where((w) => {
        w.whereNull('expires_at').orWhere('expires_at', '>', now);
      });
}

export async function pageApiKeys(
  db: Knex,
  userId: string,
  q: { state?: ApiKeyState; now: Date; page: number; pageSize: number },
): Promise<{ items: ApiKeyRow[]; total: number }> {
  const base = apiKeys(db).where({ user_id: userId });
  if (q.state) whereState(base, q.state, q.now);
  return newestFirstPage<ApiKeyRow>(base, q);
}

/** Revokes every unrevoked key of the account and forgets their sealed values; answers the keys revoked. */
export const revokeKeysOfAccount = async (trx: Knex.Transaction, userId: string, at: Date): Promise<Pick<ApiKeyRow, 'id' | 'prefix'>[]> =>
  apiKeys(trx).where({ user_id: userId }).whereNull('revoked_at').update({ revoked_at: at, value_sealed: null, updated_at: at }).returning(['id', 'prefix']);

export async function countUnrevoked(db: Knex, userId: string): Promise<number> {
  const [row] = await apiKeys(db).where({ user_id: userId }).whereNull('revoked_at').count<{ count: number }[]>({ count: '*' });
  return row?.count ?? 0;
}
