import { randomUUID } from 'node:crypto';
import type { Container } from '../container';
import { AppError, conflict, invalid } from '../errors';
import { emitEvent } from '../events';
import { auditKeyRefusal, checkKeyLimit, generationRow, newLineage, storeKey, storeRecipientUpgrade, type LineageSpec } from './key-catalog';
import { resyncLinkedTo } from '../teams/team-access';
import { randomSecret } from '../lineage';
import type { RequestMeta } from '../../db/audit';
import { findKeyByFingerprint, type KeyRow, type LineageRow } from '../../db/keys';

export interface ImportInput {
  /** The transferable key as sent (armored or binary). */
  key: Uint8Array;
  /** Unlocks the key as it came, when it is protected; used here once and kept nowhere. */
  keyPassphrase?: string;
  /** The passphrase the key has here (a secret key only). */
  passphrase?: string;
  label: string;
  environment: string;
}

/**
 * Brings a key in. A secret key becomes a managed key whose first generation is the imported key, its
 * private key locked with a random secret and sealed like a generated generation's (lib/keys/key-catalog.ts
 * generationRow), behind a lineage lock made from `passphrase`. A public-only key becomes a recipient
 * key: a lineage with no unlock key whose generation has no private key (encrypt and verify only).
 * Fingerprints are unique within the account only: what other accounts hold is never looked at. A key
 * the account holds already is 409 `key_exists`, except the secret key of one of its recipient keys,
 * which that key takes (`upgraded`: the same lineage, now managed; lib/keys/key-catalog.ts
 * storeRecipientUpgrade). Audited (`keys.import`, success or the refusal's code; never key material)
 * and announced (`keys.imported`).
 */
export async function importKey(
  c: Container,
  userId: string,
  input: ImportInput,
  meta: RequestMeta,
): Promise<{ lineage: LineageRow; key: KeyRow; upgraded: boolean }> {
  await checkKeyLimit(c, userId); // early 402, before any parse
  const fail = async (err: unknown, target: string | null = null) => {
    await auditKeyRefusal(c, userId, 'keys.import', target, err instanceof AppError ? err.code : 'error', meta);
    return err;
  };
  const secret = randomSecret();
  // Wall-clock time, not c.clock: OpenPGP.js checks key validity against the real time.
  const imported = await c.untrusted
    .run('importKey', { data: input.key, keyPassphrase: input.keyPassphrase, secret, now: new Date() })
    .catch(async (err: unknown) => {
      throw await fail(err);
    });
  if (imported.secret && !input.passphrase)
    throw await fail(
      invalid('passphrase_required', 'A secret key needs `passphrase`: the passphrase it will have here (at least 12 characters).'),
      imported.fingerprint,
    );
  const described = {
    label: input.label,
    environment: input.environment,
    uid_name: imported.uidName,
    uid_email: imported.uidEmail,
    algorithm: imported.rotationAlgorithm,
    profile: imported.profile,
    key_ttl_days: null,
  };
  const exists = conflict('key_exists', `This account already holds this key (${imported.fingerprint}).`);
  const held = await findKeyByFingerprint(c.db, userId, imported.fingerprint);
  if (held && !(imported.secret && held.lineage.kind === 'recipient')) throw await fail(exists, imported.fingerprint);
  const spec: LineageSpec = imported.secret
    ? await newLineage(c, described, input.passphrase!, held?.lineage.id)
    : { ...described, id: randomUUID(), unlock_public: '', unlock_locked: '' };
  const kind = imported.secret ? 'managed' : 'recipient';
  let stored: { lineage: LineageRow; key: KeyRow };
  try {
    stored = held
      ? await storeRecipientUpgrade(c, userId, spec, imported, secret, meta)
      : await storeKey(c, userId, spec, await generationRow(c, { ...spec, user_id: userId }, 1, imported, secret), meta, { kind });
  } catch (err) {
    if (err instanceof AppError && err.code === 'key_exists') throw await fail(err, imported.fingerprint);
    // An import of the same key into the same account that got there first (pgp_keys_account_fingerprint).
    if ((err as { code?: string }).code === '23505') throw await fail(exists, imported.fingerprint);
    throw err;
  }
  await emitEvent(c, userId, 'keys.imported', {
    lineage_id: spec.id,
    fingerprint: stored.key.fingerprint,
    label: spec.label,
    environment: spec.environment,
    algorithm: stored.key.algorithm,
    profile: stored.key.profile,
    kind,
    upgraded: Boolean(held),
  });
  await resyncLinkedTo(c, userId, 'keys.imported', meta);
  return { ...stored, upgraded: Boolean(held) };
}
