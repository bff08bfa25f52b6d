import type { Container } from '../container';
import type { KeyRow, LineageRow } from '../../db/keys';

/**
 * The public columns that decide where data is encrypted and which key opens it (a lineage's unlock
 * public key; a generation's fingerprint, encryption key ids and public key) carry a MAC under the
 * master key, bound to their row (lineage, account, generation). They are verified before use, so a
 * database write alone cannot redirect encryption to another key: a mismatch is an integrity error
 * (500, logged), never a silent use of the substituted key.
 */
type LineageFields = Pick<LineageRow, 'id' | 'user_id' | 'unlock_public'>;
type KeyFields = Pick<KeyRow, 'lineage_id' | 'user_id' | 'generation' | 'fingerprint' | 'encryption_key_ids' | 'public_armored'>;

const lineageData = (l: LineageFields) => JSON.stringify(['kms/lineage/v1', l.id, l.user_id, l.unlock_public]);
const keyData = (k: KeyFields) => JSON.stringify(['kms/pgp-key/v1', k.lineage_id, k.user_id, k.generation, k.fingerprint, k.encryption_key_ids, k.public_armored]);

export const lineageMac = (c: Pick<Container, 'sealer'>, l: LineageFields) => c.sealer.mac(lineageData(l));
export const keyMac = (c: Pick<Container, 'sealer'>, k: KeyFields) => c.sealer.mac(keyData(k));

export class IntegrityError extends Error {
  constructor(what: string) {
    super(`integrity check failed: ${what} was changed outside the service`);
    this.name = 'IntegrityError';
  }
}

export function verifiedLineage<L extends LineageFields & { unlock_mac: string | null }>(c: Pick<Container, 'sealer'>, l: L): L {
  if (!l.unlock_mac || !c.sealer.verifyMac(lineageData(l), l.unlock_mac)) throw new IntegrityError(`key lineage ${l.id}`);
  return l;
}

export function verifiedKey<K extends KeyFields & { public_mac: string | null }>(c: Pick<Container, 'sealer'>, k: K): K {
  if (!k.public_mac || !c.sealer.verifyMac(keyData(k), k.public_mac)) throw new IntegrityError(`key ${k.fingerprint} (generation ${k.generation})`);
  return k;
}

/**
 * Gives rows from before the MAC columns their MACs (once; idempotent). Runs when a process starts,
 * after migrations, since only the service holds the master key.
 */
export async function backfillKeyMacs(c: Container): Promise<number> {
  let n = 0;
  for (const l of await c.db<LineageRow>('key_lineages').whereNull('unlock_mac')) {
    n += await c.db('key_lineages').where({ id: l.id }).whereNull('unlock_mac').update({ unlock_mac: lineageMac(c, l) });
  }
  for (const k of await c.db<KeyRow>('pgp_keys').whereNull('public_mac')) {
    n += await c.db('pgp_keys').where({ id: k.id }).whereNull('public_mac').update({ public_mac: keyMac(c, k) });
  }
  return n;
}
