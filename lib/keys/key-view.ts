import type { ListedKey } from '../../db/keys';
import { keyStatus } from './key-catalog';

/**
 * A key as the API shows it: the lineage with its current generation; never private material. It needs
 * only the columns the key list selects (db/keys.ts LISTED_LINEAGE, LISTED_KEY).
 */
export function keyOut(lineage: ListedKey['lineage'], current: ListedKey['current'], now: Date) {
  const status = keyStatus(lineage, current, now);
  return {
    lineage_id: lineage.id,
    fingerprint: current.fingerprint,
    label: lineage.label,
    environment: lineage.environment,
    algorithm: current.algorithm,
    profile: current.profile,
    rotation_profile: lineage.profile,
    kind: lineage.kind,
    imported: current.imported,
    uid: `${lineage.uid_name} <${lineage.uid_email}>`,
    status,
    active: status === 'active',
    generation: current.generation,
    created_at: lineage.created_at.toISOString(),
    key_created_at: current.created_at.toISOString(),
    expires_at: current.expires_at?.toISOString() ?? null,
    disabled_at: lineage.disabled_at?.toISOString() ?? null,
    rotation_mode: lineage.rotation_mode,
    rotation_interval_days: lineage.rotation_interval_days,
  };
}
