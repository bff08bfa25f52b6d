import type { Sealer } from '../sealer';
import { aad as keyAad } from '../keys/key-catalog';
import { valueAad } from '../accounts/api-keys';
import { secretAad } from '../webhooks/endpoints';
import { recipientAad, shareTokenAad } from '../sharing/share-links';
import { dataKeyAad } from '../blob/data-keys';
import { signingKeyAad } from '../audit/audit-evidence';
import { keyMac, lineageMac, verifiedKey, verifiedLineage, type KeyMacFields, type LineageMacFields } from '../integrity';

/** A row as the re-seal reads it: its key as `id`, the sealed column and the columns `renew` reads. */
export type SealedRow = Record<string, unknown> & { id: string };

/**
 * Every column of Postgres that holds a value sealed under a data key (`s1.<kid>.…`) or a row MAC
 * (`m1.<kid>.…`): what `master-key status` counts per key id and the re-seal job moves to the current
 * key. A new sealed column is added here, or retiring a key would strand its values.
 */
export interface StoredSeal {
  table: string;
  column: string;
  /** The row's key column and its SQL type, when not a uuid `id` (`renew` sees it as `row.id`). */
  key?: { column: string; type: 'text' };
  /** The other columns `renew` reads. */
  reads: string[];
  /**
   * The column's value under the current key: the sealed value opened and sealed again with the same AAD,
   * or a MAC made again once the old one verified. Throws when it does not open or verify (the row is left).
   */
  renew(sealer: Sealer, row: SealedRow): string;
}

const resealed = (aad: (row: SealedRow) => string, column: string) => (sealer: Sealer, row: SealedRow) =>
  sealer.seal(sealer.open(row[column] as string, aad(row)), aad(row));

export const STORED_SEALS: StoredSeal[] = [
  { table: 'key_lineages', column: 'unlock_locked', reads: [], renew: resealed((r) => keyAad.unlock(r.id), 'unlock_locked') },
  {
    table: 'key_lineages',
    column: 'unlock_mac',
    reads: ['user_id', 'unlock_public', 'profile'],
    renew: (sealer, r) => lineageMac({ sealer }, verifiedLineage({ sealer }, r as unknown as LineageMacFields & { unlock_mac: string })),
  },
  {
    table: 'pgp_keys',
    column: 'private_sealed',
    reads: ['lineage_id', 'generation'],
    renew: resealed((r) => keyAad.private(r.lineage_id as string, r.generation as number), 'private_sealed'),
  },
  {
    table: 'pgp_keys',
    column: 'secret_sealed',
    reads: ['lineage_id', 'generation'],
    renew: resealed((r) => keyAad.secret(r.lineage_id as string, r.generation as number), 'secret_sealed'),
  },
  {
    table: 'pgp_keys',
    column: 'public_mac',
    reads: ['lineage_id', 'user_id', 'generation', 'fingerprint', 'encryption_key_ids', 'public_armored'],
    renew: (sealer, r) => keyMac({ sealer }, verifiedKey({ sealer }, r as unknown as KeyMacFields & { public_mac: string })),
  },
  {
    table: 'api_keys',
    column: 'value_sealed',
    reads: ['current_secret_id'],
    renew: resealed((r) => valueAad(r.id, r.current_secret_id as string), 'value_sealed'),
  },
  { table: 'webhook_endpoints', column: 'secret_sealed', reads: [], renew: resealed((r) => secretAad(r.id, 'current'), 'secret_sealed') },
  { table: 'webhook_endpoints', column: 'previous_secret_sealed', reads: [], renew: resealed((r) => secretAad(r.id, 'previous'), 'previous_secret_sealed') },
  { table: 'share_links', column: 'recipient_sealed', reads: [], renew: resealed((r) => recipientAad(r.id), 'recipient_sealed') },
  { table: 'share_links', column: 'token_sealed', reads: [], renew: resealed((r) => shareTokenAad(r.id), 'token_sealed') },
  { table: 'jobs', column: 'data_key', reads: [], renew: resealed((r) => dataKeyAad(r.id), 'data_key') },
  {
    table: 'audit_signing_keys',
    column: 'private_sealed',
    key: { column: 'kid', type: 'text' },
    reads: [],
    renew: resealed((r) => signingKeyAad(r.id), 'private_sealed'),
  },
];

/** The key id of a stored `s1.<kid>.…` or `m1.<kid>.…` value, in SQL. */
export const kidSql = (column: string) => `split_part(${column}, '.', 2)`;
/** Rows whose column holds something sealed (destroyed generations hold '', revoked API keys null). */
export const holdsSeal = (column: string) => `${column} IS NOT NULL AND ${column} <> ''`;
