import type { Knex } from 'knex';
import type { AuditContent } from '../lib/audit-chain';

/** A row as the export and the verifiers read it: `created_at` is the hashed text (UTC, microseconds). */
export interface ChainRow extends AuditContent {
  audit_id: number;
  /** The action's current name when the row was written under a legacy one (`action`, which the digest covers); null otherwise. */
  renamed_to: string | null;
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

/**
 * Rows of `chain` with `from` ≤ sequence < `from + count`, in order. The range is bounded at both ends so
 * that whatever plan the statistics lead to, a page reads at most `count` rows: with `sequence ≥ from`
 * alone and stale statistics, Postgres chose a bitmap scan of the whole rest of the chain and a sort,
 * for every page (a chain read quadratic in its length).
 */
export async function chainRows(db: Knex, chain: string, from: number, count: number): Promise<ChainRow[]> {
  return db('audit_logs')
    .where({ chain })
    .andWhere('sequence', '>=', from)
    .andWhere('sequence', '<', from + count)
    .orderBy('sequence')
    .select(
      'id as audit_id',
      'sequence',
      'prev_hash',
      'hash',
      // What the row's digest covers: the action as written (migration 035 renamed some, keeping this).
      db.raw('coalesce(recorded_action, action) AS action'),
      db.raw('CASE WHEN recorded_action IS NOT NULL THEN action END AS renamed_to'),
      'status',
      'target',
      'ip',
      'request_id',
      'client_request_id',
      'details',
      db.raw(`to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at`),
    );
}

/** The lowest sequence ≥ `from` among the rows of `chain` (where reading goes on after deleted rows), or null when there is none. */
export async function nextChainSequence(db: Knex, chain: string, from: number): Promise<number | null> {
  const row = await db('audit_logs').where({ chain }).andWhere('sequence', '>=', from).min<{ min: number | string | null }>('sequence as min').first();
  return row?.min == null ? null : Number(row.min);
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

/** The chain's newest checkpoint with a sequence below `before` (any, when not given), or undefined. */
export async function checkpointBefore(db: Knex, chain: string, before?: number): Promise<{ sequence: number } | undefined> {
  const q = db<CheckpointRow>('audit_checkpoints').where({ chain });
  if (before !== undefined) q.andWhere('sequence', '<', before);
  return q.orderBy('sequence', 'desc').first('sequence');
}

/**
 * Stores a checkpoint that follows the chain's checkpoint of sequence `after` (0: the chain's first).
 * Null when the chain's newest checkpoint is another by now (a signer that ran at the same time stored
 * one): two signers never both extend the same checkpoint, so the checkpoints of a chain stay one line.
 */
export async function insertNextCheckpoint(db: Knex, cp: CheckpointRow, after: number): Promise<CheckpointRow | null> {
  return db.transaction(async (trx) => {
    await trx.raw('SELECT pg_advisory_xact_lock(hashtextextended(?, 0))', [`audit_checkpoints:${cp.chain}`]);
    const newest = await checkpointBefore(trx, cp.chain);
    if ((newest?.sequence ?? 0) !== after) return null;
    const [row] = await trx('audit_checkpoints')
      .insert(cp)
      .onConflict(['chain', 'sequence'])
      .ignore()
      .returning<CheckpointRow[]>(['chain', 'sequence', 'hash', 'signed_at', 'kid', 'jws']);
    return row ?? null;
  });
}

export const currentSigningKey = async (db: Knex): Promise<SigningKeyRow | undefined> =>
  db<SigningKeyRow>('audit_signing_keys').whereNull('retired_at').first();

/** Every signing key, current and retired, oldest first, with its sealed private part (the JWKS is made from it). */
export const signingKeys = async (db: Knex): Promise<Pick<SigningKeyRow, 'kid' | 'private_sealed' | 'created_at' | 'retired_at'>[]> =>
  db<SigningKeyRow>('audit_signing_keys').orderBy('created_at').select('kid', 'private_sealed', 'created_at', 'retired_at');

/** Retires the current key and stores `next` as current, in one transaction. */
export async function replaceSigningKey(db: Knex, next: Omit<SigningKeyRow, 'retired_at'>, now: Date): Promise<void> {
  await db.transaction(async (trx) => {
    await trx('audit_signing_keys').whereNull('retired_at').update({ retired_at: now });
    await trx('audit_signing_keys').insert({ ...next, public_jwk: JSON.stringify(next.public_jwk) });
  });
}
