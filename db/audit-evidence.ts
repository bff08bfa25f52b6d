import type { Knex } from 'knex';
import type { AuditContent } from '../lib/audit-chain';

/** A row as the export and the verifiers read it: `created_at` is the hashed text (UTC, microseconds). */
export interface ChainRow extends AuditContent {
  audit_id: number;
  sequence: number;
  prev_hash: string;
  hash: string;
  created_at: string;
}

export interface CheckpointRow {
  chain: string;
  sequence: number;
  hash: string;
  signed_at: Date;
  kid: string;
  jws: string;
}

export interface SigningKeyRow {
  kid: string;
  public_jwk: { kty: string; crv: string; x: string };
  private_sealed: string;
  created_at: Date;
  retired_at: Date | null;
}

/** Rows of `chain` with sequence ≥ `from`, in order, at most `limit`. */
export async function chainRows(db: Knex, chain: string, from: number, limit: number): Promise<ChainRow[]> {
  return db('audit_logs')
    .where({ chain })
    .andWhere('sequence', '>=', from)
    .orderBy('sequence')
    .limit(limit)
    .select(
      'id as audit_id',
      'sequence',
      'prev_hash',
      'hash',
      'action',
      'status',
      'target',
      'ip',
      'request_id',
      'client_request_id',
      'details',
      db.raw(`to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at`),
    );
}

/** Checkpoints of `chain` with from ≤ sequence (≤ to when given), in order. */
export async function chainCheckpoints(db: Knex, chain: string, from: number, to?: number): Promise<CheckpointRow[]> {
  const q = db<CheckpointRow>('audit_checkpoints').where({ chain }).andWhere('sequence', '>=', from);
  if (to !== undefined) q.andWhere('sequence', '<=', to);
  return q.orderBy('sequence').select('chain', 'sequence', 'hash', 'signed_at', 'kid', 'jws');
}

/** Chain heads that moved past their last checkpoint, after `afterChain` (pages by chain), at most `limit`. */
export async function movedChains(db: Knex, afterChain: string, limit: number): Promise<{ chain: string; sequence: number; hash: string }[]> {
  return db('audit_chains as h')
    .where('h.chain', '>', afterChain)
    .andWhere('h.sequence', '>', db.raw('COALESCE((SELECT max(cp.sequence) FROM audit_checkpoints cp WHERE cp.chain = h.chain), 0)'))
    .orderBy('h.chain')
    .limit(limit)
    .select('h.chain', 'h.sequence', 'h.hash');
}

/** Stores a checkpoint once: null when another scheduler stored the same one first. */
export async function insertCheckpoint(db: Knex, cp: CheckpointRow): Promise<CheckpointRow | null> {
  const [row] = await db('audit_checkpoints')
    .insert(cp)
    .onConflict(['chain', 'sequence'])
    .ignore()
    .returning<CheckpointRow[]>(['chain', 'sequence', 'hash', 'signed_at', 'kid', 'jws']);
  return row ?? null;
}

export const currentSigningKey = async (db: Knex): Promise<SigningKeyRow | undefined> =>
  db<SigningKeyRow>('audit_signing_keys').whereNull('retired_at').first();

/** Every signing key, current and retired, oldest first: what the JWKS publishes. */
export const signingKeys = async (db: Knex): Promise<Pick<SigningKeyRow, 'kid' | 'public_jwk' | 'created_at' | 'retired_at'>[]> =>
  db<SigningKeyRow>('audit_signing_keys').orderBy('created_at').select('kid', 'public_jwk', 'created_at', 'retired_at');

/** Retires the current key and stores `next` as current, in one transaction. */
export async function replaceSigningKey(db: Knex, next: Omit<SigningKeyRow, 'retired_at'>, now: Date): Promise<void> {
  await db.transaction(async (trx) => {
    await trx('audit_signing_keys').whereNull('retired_at').update({ retired_at: now });
    await trx('audit_signing_keys').insert({ ...next, public_jwk: JSON.stringify(next.public_jwk) });
  });
}
