import type { Sealer } from './sealer';

/**
 * Row MACs of the public columns that decide where data is encrypted and which key opens it: a
 * lineage's unlock public key; a generation's fingerprint, encryption key ids and public key. Each MAC
 * is an HMAC under a key derived from the master key (Sealer.mac), over the columns *and* the row they
 * belong to (lineage, account, generation), so a database write alone can neither change a key nor move
 * another row's key and MAC into place. Rows are verified before use: a mismatch is an IntegrityError
 * (a 500, logged), never a silent use of the substituted key.
 *
 * A row with no MAC is refused like a wrong one. Rows from before the MAC columns got theirs once, in
 * the migration that added the columns (db/migrations/005_key_integrity.ts); nothing MACs a stored row
 * later, so clearing a MAC in the database cannot get a changed key blessed at the next start.
 */
type Macs = { sealer: Pick<Sealer, 'mac' | 'verifyMac'> };

export interface LineageMacFields {
  id: string;
  user_id: string;
  unlock_public: string;
  /** The OpenPGP profile its next generation is made with: a database write must not downgrade it. */
  profile: string;
}

export interface KeyMacFields {
  lineage_id: string;
  user_id: string;
  generation: number;
  fingerprint: string;
  encryption_key_ids: string[];
  public_armored: string;
}

/** `rfc4880`, every lineage's profile before there were others, keeps the MAC those lineages were stored with. */
const lineageData = (l: LineageMacFields) =>
  JSON.stringify(
    l.profile === 'rfc4880' ? ['kms/lineage/v1', l.id, l.user_id, l.unlock_public] : ['kms/lineage/v2', l.id, l.user_id, l.unlock_public, l.profile],
  );
const keyData = (k: KeyMacFields) =>
  JSON.stringify(['kms/pgp-key/v1', k.lineage_id, k.user_id, k.generation, k.fingerprint, k.encryption_key_ids, k.public_armored]);

export const lineageMac = (c: Macs, l: LineageMacFields) => c.sealer.mac(lineageData(l));
export const keyMac = (c: Macs, k: KeyMacFields) => c.sealer.mac(keyData(k));

export class IntegrityError extends Error {
  constructor(what: string) {
    super(`integrity check failed: ${what} was changed outside the service (or has no MAC); it is not used`);
    this.name = 'IntegrityError';
  }
}

export function verifiedLineage<L extends LineageMacFields & { unlock_mac: string | null }>(c: Macs, l: L): L {
  if (!l.unlock_mac || !c.sealer.verifyMac(lineageData(l), l.unlock_mac)) throw new IntegrityError(`key lineage ${l.id}`);
  return l;
}

export function verifiedKey<K extends KeyMacFields & { public_mac: string | null }>(c: Macs, k: K): K {
  if (!k.public_mac || !c.sealer.verifyMac(keyData(k), k.public_mac)) throw new IntegrityError(`key ${k.fingerprint} (generation ${k.generation})`);
  return k;
}
