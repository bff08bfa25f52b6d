import { randomUUID } from 'node:crypto';
import { enforcePlanLimit } from '../billing/subscriptions';
import type { Knex } from 'knex';
import type { Container } from '../container';
import { conflict, gone, invalid, notFound } from '../errors';
import { notYours } from '../auth/ownership';
import { keyMac, lineageMac, verifiedKey, verifiedLineage } from './key-integrity';
import { generateKey, unlockStoredKey, type GeneratedKey, type KeyAlgorithm, type KeyProfile, type StoredPrivateKey } from '../pgp/keys';
import { createLineageLock, openLineageLock, openSealedSecret, randomSecret, sealSecret, type UnlockKey } from '../lineage';
import { recordAudit, type RequestMeta } from '../../db/audit';
import {
  listKeys,
  disableLineage,
  findLineage,
  activeGeneration,
  findKeyByFingerprint,
  insertKey,
  insertLineage,
  lineageUsableBy,
  lockLineageWithGenerations,
  lockedTokenKey,
  storeGenerationKey,
  updateLineage,
  type KeyRow,
  type KeyListQuery,
  type KeyView,
  type LineageKind,
  type LineageRow,
} from '../../db/keys';
import { isLineageSealed } from '../root-of-trust/lineage-keys';
import type { AuditAction } from '../event-names';

/**
 * Keys as users see them. A lineage holds the label, environment and the passphrase-locked unlock key;
 * each generation is an OpenPGP key whose private half is locked with a random secret sealed to the
 * lineage. Every stored secret is also sealed under the master key, bound (AAD) to its row; with
 * LINEAGE_TOKEN_KEYS the private key is first sealed under the lineage's own key in the token.
 */

export interface LineageSpec {
  id: string;
  label: string;
  environment: string;
  uid_name: string;
  uid_email: string;
  algorithm: KeyAlgorithm;
  profile: KeyProfile;
  key_ttl_days: number | null;
  unlock_public: string;
  /** Master-key sealed. */
  unlock_locked: string;
}

export const aad = {
  unlock: (lineageId: string) => `lineage-unlock:${lineageId}`,
  private: (lineageId: string, generation: number) => `pgp-private:${lineageId}:${generation}`,
  secret: (lineageId: string, generation: number) => `pgp-secret:${lineageId}:${generation}`,
};

/** Derives the lineage lock from the passphrase (argon2id; tens of ms), ready to be stored. */
export async function newLineage(
  c: Container,
  input: Omit<LineageSpec, 'id' | 'unlock_public' | 'unlock_locked'>,
  passphrase: string,
  id: string = randomUUID(),
): Promise<LineageSpec> {
  const lock = await createLineageLock(passphrase);
  return { ...input, id, unlock_public: lock.publicKey, unlock_locked: c.sealer.seal(lock.lockedPrivate, aad.unlock(id)) };
}

export type GenerationRow = Omit<Parameters<typeof insertKey>[1], 'imported'>;

/** What deciding on the token layer needs of a lineage: its `token_key` once stored. */
type TokenKeyed = Partial<Pick<LineageRow, 'token_key'>>;

/**
 * Whether a generation's private key is sealed under its lineage's token key: for a new lineage (its first
 * generation) as LINEAGE_TOKEN_KEYS says, and then for the lineage's whole life as its `token_key` says,
 * whatever the setting is later. A recipient key has no private key, so no token key.
 */
const usesTokenKey = (c: Container, lineage: TokenKeyed, generation: number) =>
  generation === 1 ? c.config.masterKeys.lineageTokenKeys : Boolean(lineage.token_key);

/**
 * The private key's sealed column: under the lineage's token key first when it has one (its first
 * generation makes the key; a later one finds it, or fails with 410 naming the lineage), then under the
 * keyring as every stored value.
 */
async function sealPrivateKey(c: Container, lineage: { id: string } & TokenKeyed, generation: number, armored: string): Promise<string> {
  if (!usesTokenKey(c, lineage, generation)) return c.sealer.seal(armored, aad.private(lineage.id, generation));
  if (generation === 1) await c.lineageKeys.ensure(lineage.id);
  return c.sealer.seal(await c.lineageKeys.seal(lineage.id, generation, armored), aad.private(lineage.id, generation));
}

/** The armored private key of a generation (not destroyed): one token call when its lineage has a token key. */
async function openPrivateKey(c: Container, key: Pick<KeyRow, 'lineage_id' | 'generation' | 'private_sealed'>): Promise<string> {
  const inner = c.sealer.openText(key.private_sealed, aad.private(key.lineage_id, key.generation));
  return isLineageSealed(inner) ? c.lineageKeys.open(key.lineage_id, key.generation, inner) : inner;
}

/** Makes generation `generation` of a lineage. Needs no passphrase: the secret is sealed to the lineage's public key. */
export async function newGeneration(
  c: Container,
  lineage: Pick<LineageSpec, 'id' | 'uid_name' | 'uid_email' | 'algorithm' | 'profile' | 'key_ttl_days' | 'unlock_public'> & { user_id: string } & TokenKeyed,
  generation: number,
): Promise<GenerationRow> {
  const secret = randomSecret();
  const key = await generateKey({
    name: lineage.uid_name,
    email: lineage.uid_email,
    profile: lineage.profile,
    algorithm: lineage.algorithm,
    secret,
    expiresInDays: lineage.key_ttl_days ?? undefined,
    // Wall-clock time, not c.clock: OpenPGP.js checks key validity against the real time.
  });
  return generationRow(c, lineage, generation, key, secret);
}

/** The OpenPGP key of a generation, whether generated here or imported; `privateArmored` null for a recipient key. */
export type GenerationKey = Pick<GeneratedKey, 'fingerprint' | 'encryptionKeyIds' | 'publicArmored' | 'expiresAt' | 'profile'> & {
  algorithm: string;
  privateArmored: string | null;
};

/**
 * A generation row for `key`: its public columns MAC'd, its private key (locked with `secret`, from
 * randomSecret) sealed under the master key (sealPrivateKey) and `secret` sealed to the lineage's unlock
 * key, each bound to the row. Generated and imported generations are stored alike.
 */
export async function generationRow(
  c: Container,
  lineage: Pick<LineageSpec, 'id' | 'unlock_public'> & { user_id: string } & TokenKeyed,
  generation: number,
  key: GenerationKey,
  secret: string,
): Promise<GenerationRow> {
  const identity = {
    lineage_id: lineage.id,
    user_id: lineage.user_id,
    generation,
    fingerprint: key.fingerprint,
    encryption_key_ids: key.encryptionKeyIds,
    public_armored: key.publicArmored,
  };
  const where = aad.secret(lineage.id, generation);
  return {
    ...identity,
    public_mac: keyMac(c, identity),
    algorithm: key.algorithm,
    profile: key.profile,
    private_sealed: key.privateArmored === null ? '' : await sealPrivateKey(c, lineage, generation, key.privateArmored),
    secret_sealed: key.privateArmored === null ? '' : c.sealer.seal(sealSecret(lineage.unlock_public, secret, where), where),
    expires_at: key.expiresAt,
  };
}

/** What a `keys.generated` event says (ids and names, nothing secret). */
export const keyGeneratedData = (
  spec: Pick<LineageSpec, 'id' | 'label' | 'environment' | 'algorithm' | 'profile'>,
  first: Pick<GenerationRow, 'fingerprint'>,
) => ({
  lineage_id: spec.id,
  fingerprint: first.fingerprint,
  label: spec.label,
  environment: spec.environment,
  algorithm: spec.algorithm,
  profile: spec.profile,
});

/** The early plan check of a key creation (402 before the slow part); storeNewKey checks again when it inserts. */
export const checkKeyLimit = (c: Container, userId: string): Promise<void> => c.db.transaction((trx) => enforcePlanLimit(c, trx, userId, 'keys'));

/** storeNewKey in a transaction of its own; a lineage it could not store leaves no token key behind. */
export async function storeKey(
  c: Container,
  userId: string,
  spec: LineageSpec,
  first: GenerationRow,
  meta: RequestMeta,
  imported?: { kind: LineageKind },
): Promise<{ lineage: LineageRow; key: KeyRow }> {
  try {
    return await c.db.transaction((trx) => storeNewKey(c, trx, userId, spec, first, meta, imported));
  } catch (err) {
    if (first.private_sealed) await dropUnstoredTokenKey(c, spec.id);
    throw err;
  }
}

/**
 * The token key a first generation made (LINEAGE_TOKEN_KEYS) for a lineage that was never stored (its
 * insert failed, or its job failed for good): nothing is sealed under it, and it would stay in the token.
 */
export async function dropUnstoredTokenKey(c: Container, lineageId: string): Promise<void> {
  if (usesTokenKey(c, {}, 1))
    await c.lineageKeys.remove(lineageId).catch((err: unknown) => c.log.warn({ err, lineage_id: lineageId }, 'could not delete an unused token key'));
}

/** Stores a new lineage with its first generation and the audit row, in the caller's transaction. */
export async function storeNewKey(
  c: Container,
  trx: Knex.Transaction,
  userId: string,
  spec: LineageSpec,
  first: GenerationRow,
  meta: Partial<RequestMeta> & { job_id?: string },
  imported?: { kind: LineageKind },
): Promise<{ lineage: LineageRow; key: KeyRow }> {
  await enforcePlanLimit(c, trx, userId, 'keys'); // plan limit (402), counted under the account's row lock
  const lineage = await insertLineage(trx, {
    ...spec,
    kind: imported?.kind ?? 'managed',
    user_id: userId,
    unlock_mac: lineageMac(c, { ...spec, user_id: userId }),
    token_key: first.private_sealed !== '' && usesTokenKey(c, {}, 1),
  });
  const key = await insertKey(trx, { ...first, imported: Boolean(imported) });
  await recordAudit(
    trx,
    {
      user_id: userId,
      action: imported ? 'keys.import' : 'keys.generate',
      status: 'success',
      target: key.fingerprint,
      details: {
        label: spec.label,
        environment: spec.environment,
        algorithm: first.algorithm,
        profile: first.profile,
        ...(imported ? { kind: imported.kind } : {}),
        ...(meta.job_id ? { job_id: meta.job_id } : {}),
      },
    },
    meta,
  );
  return { lineage, key };
}

/**
 * A recipient key of the account becomes a managed key: the secret key of its fingerprint was imported.
 * Under the lineage's row lock, it must still be a recipient key, not destroyed nor scheduled for
 * destruction (409 `key_exists` otherwise, saying which); then the lineage gets `spec`'s lock, label and
 * names, and its one generation the imported key (its public columns as the secret key has them, its
 * private key sealed as a first generation's, under a token key of its own with LINEAGE_TOKEN_KEYS).
 * The lineage id stays, so its shares and team grants stay too. Audited `keys.import` (`upgraded`).
 */
export async function storeRecipientUpgrade(
  c: Container,
  userId: string,
  spec: LineageSpec,
  key: GenerationKey,
  secret: string,
  meta: RequestMeta,
): Promise<{ lineage: LineageRow; key: KeyRow }> {
  let sealing = false;
  try {
    return await c.db.transaction(async (trx) => {
      const { lineage, generations } = await lockLineageWithGenerations(trx, spec.id);
      requireUpgradable(lineage, generations, key.fingerprint);
      sealing = true;
      const first = await generationRow(c, { ...spec, user_id: userId }, 1, key, secret);
      const now = c.clock.now();
      const upgraded = await updateLineage(trx, spec.id, {
        kind: 'managed',
        label: spec.label,
        environment: spec.environment,
        uid_name: spec.uid_name,
        uid_email: spec.uid_email,
        algorithm: spec.algorithm,
        profile: spec.profile,
        unlock_public: spec.unlock_public,
        unlock_locked: spec.unlock_locked,
        unlock_mac: lineageMac(c, { ...spec, user_id: userId }),
        token_key: usesTokenKey(c, {}, 1),
        updated_at: now,
      });
      const stored = await storeGenerationKey(trx, generations[0].id, first);
      await recordAudit(
        trx,
        {
          user_id: userId,
          action: 'keys.import',
          status: 'success',
          target: stored.fingerprint,
          details: { label: spec.label, environment: spec.environment, algorithm: first.algorithm, kind: 'managed', upgraded: 'recipient' },
        },
        meta,
      );
      return { lineage: upgraded, key: stored };
    });
  } catch (err) {
    // The lineage stayed a recipient key: a token key made for it holds nothing, unless another upgrade
    // (which waited for this one's lock) has stored under it since: looked at under the same lock.
    if (sealing && usesTokenKey(c, {}, 1) && !(await c.db.transaction((trx) => lockedTokenKey(trx, spec.id)))) await dropUnstoredTokenKey(c, spec.id);
    throw err;
  }
}

/** The 409 of a secret key import whose fingerprint the account holds in a key that cannot take it. */
function requireUpgradable(lineage: LineageRow, generations: KeyRow[], fingerprint: string): void {
  const held = `This account already holds this key (${fingerprint})`;
  if (lineage.kind !== 'recipient' || generations.length !== 1 || generations[0].fingerprint !== fingerprint)
    throw conflict('key_exists', `${held}, with its secret key.`);
  if (lineage.destroyed_at || generations[0].destroyed_at)
    throw conflict('key_exists', `${held} as a recipient key that was destroyed; its fingerprint stays taken in this account.`);
  if (lineage.destroy_after || generations[0].destroy_after)
    throw conflict('key_exists', `${held} as a recipient key scheduled for destruction; cancel the destruction, then import the secret key again.`);
}

export interface Rekeyed {
  unlock_public: string;
  /** Master-key sealed. */
  unlock_locked: string;
  unlock_mac: string;
  /** Each existing generation's secret, sealed to the new unlock key. */
  secrets: { id: string; secret_sealed: string }[];
}

/**
 * A passphrase change makes a new unlock key pair (not the old key under a new passphrase) and seals
 * every generation's secret to it: the old passphrase with an old row or backup then opens nothing made
 * or re-sealed since. Throws 422 `wrong_passphrase` if `current` is wrong. The caller stores the result
 * in one transaction, with the next generation sealed to `unlock_public`.
 */
export async function rekeyLineage(c: Container, lineage: LineageRow, generations: KeyRow[], passphrases: { current: string; next: string }): Promise<Rekeyed> {
  const old = await unlockLineage(c, lineage, passphrases.current);
  for (const g of generations) verifiedKey(c, g);
  const lock = await createLineageLock(passphrases.next);
  // A destroyed generation has no secret left to re-seal.
  const secrets = generations
    .filter((g) => !g.destroyed_at)
    .map((g) => {
      const where = aad.secret(g.lineage_id, g.generation);
      const secret = openSealedSecret(old, c.sealer.openText(g.secret_sealed, where), where);
      return { id: g.id, secret_sealed: c.sealer.seal(sealSecret(lock.publicKey, secret, where), where) };
    });
  return {
    unlock_public: lock.publicKey,
    unlock_locked: c.sealer.seal(lock.lockedPrivate, aad.unlock(lineage.id)),
    unlock_mac: lineageMac(c, { ...lineage, unlock_public: lock.publicKey }),
    secrets,
  };
}

/** Opens the lineage's unlock key with the passphrase (422 `wrong_passphrase` when wrong). */
export async function unlockLineage(c: Container, lineage: Pick<LineageRow, 'id' | 'unlock_public' | 'unlock_locked'>, passphrase: string): Promise<UnlockKey> {
  const lockedPrivate = c.sealer.openText(lineage.unlock_locked, aad.unlock(lineage.id));
  return openLineageLock({ publicKey: lineage.unlock_public, lockedPrivate }, passphrase);
}

/** The usable private key of one generation, given the opened lineage. */
export async function unlockGeneration(c: Container, unlock: UnlockKey, key: KeyRow): Promise<StoredPrivateKey> {
  if (key.destroyed_at)
    throw gone(
      'generation_destroyed',
      `Generation ${key.generation} (${key.fingerprint}) of this key was destroyed; what was encrypted to it can no longer be decrypted.`,
    );
  const sealed = c.sealer.openText(key.secret_sealed, aad.secret(key.lineage_id, key.generation));
  const secret = openSealedSecret(unlock, sealed, aad.secret(key.lineage_id, key.generation));
  return unlockStoredKey(await openPrivateKey(c, key), secret);
}

/**
 * A recipient key (an imported public key) has no private key: it encrypts and verifies only. Every use
 * of a private key (decrypt, sign, rotate, a passphrase check) goes through here first.
 */
export function requireManaged(lineage: Pick<LineageRow, 'kind'>): void {
  if (lineage.kind === 'recipient')
    throw conflict(
      'recipient_key',
      'This is a recipient key (an imported public key): it encrypts and verifies, but has no private key to decrypt, sign or rotate with.',
    );
}

export type KeyStatus = 'active' | 'disabled' | 'expired';

export function keyStatus(lineage: Pick<LineageRow, 'disabled_at'>, current: Pick<KeyRow, 'expires_at'>, now: Date): KeyStatus {
  if (lineage.disabled_at) return 'disabled';
  if (current.expires_at && current.expires_at <= now) return 'expired';
  return 'active';
}

/**
 * What the caller does with a key. Team access (lib/teams/team-access.ts) lets a linked member use
 * the source's keys to read, encrypt, share and (with the key's passphrase) decrypt; managing a key
 * (disable, rotate, schedule, history) stays with its owner.
 */
export type KeyUse = 'manage' | 'read' | 'encrypt' | 'share' | 'decrypt' | 'sign';
const INHERITABLE: ReadonlySet<KeyUse> = new Set(['read', 'encrypt', 'share', 'decrypt', 'sign']);
/** Uses that need the key's private key: where the caller's own copy is a recipient key, a granted one that holds it goes first. */
const PRIVATE_USES: ReadonlySet<KeyUse> = new Set(['decrypt', 'sign']);

/**
 * Finds the caller's key by any generation's fingerprint, or for an inheritable `use` one granted to it
 * through team access (which of several: db/keys.ts findKeyByFingerprint); anything else is a 404 (never
 * "not yours"). A fingerprint names a public key anyone may hold, so whether another account holds it is
 * never looked at: the miss is audited as not_owner only when team access shows the caller the key and
 * the use is its owner's, which tells the caller nothing it cannot list. Every ownership check of a key
 * goes through here.
 */
export async function requireKey(c: Container, userId: string, fingerprint: string, meta: RequestMeta, use: KeyUse = 'manage'): Promise<KeyView> {
  const view = await findKeyByFingerprint(c.db, userId, fingerprint, { inherited: INHERITABLE.has(use), needsPrivate: PRIVATE_USES.has(use) });
  if (view)
    return { lineage: verifiedLineage(c, view.lineage), current: verifiedKey(c, view.current), named: verifiedKey(c, view.named), inherited: view.inherited };
  const granted = !INHERITABLE.has(use) && Boolean(await findKeyByFingerprint(c.db, userId, fingerprint, { inherited: true }));
  throw await notYours(
    c,
    { userId, resource: 'key', target: fingerprint, existsElsewhere: granted, meta },
    notFound('key_not_found', 'No key with this fingerprint in your account.'),
  );
}

/**
 * The generation encryption goes to: the lineage's current one, if it may encrypt (409 otherwise).
 * `jobEndsBy`: for a job, the latest time it may still be running (submission + JOB_TIMEOUT_SECONDS); a
 * key that expires before then is refused up front (409 `key_expires_during_job`) rather than failing,
 * or producing a message to an expired key, halfway through.
 */
export function encryptionTarget(view: KeyView, now: Date, jobEndsBy?: Date): KeyRow {
  const status = keyStatus(view.lineage, view.current, now);
  if (status === 'disabled') throw conflict('key_disabled', 'This key is disabled and no longer encrypts.');
  if (status === 'expired') throw conflict('key_expired', 'This key has expired and no longer encrypts; rotate it or generate a new one.');
  const expires = view.current.expires_at;
  if (jobEndsBy && expires && expires < jobEndsBy) {
    throw conflict(
      'key_expires_during_job',
      `This key expires at ${expires.toISOString()}, before a job started now is sure to finish (${jobEndsBy.toISOString()}); rotate it first.`,
    );
  }
  return view.current;
}

/** The generation signatures are made with: the lineage's current one, if it may sign (409 otherwise). */
export function signingTarget(view: Pick<KeyView, 'lineage' | 'current'>, now: Date): KeyRow {
  requireManaged(view.lineage);
  const status = keyStatus(view.lineage, view.current, now);
  if (status === 'disabled') throw conflict('key_disabled', 'This key is disabled and no longer signs.');
  if (status === 'expired') throw conflict('key_expired', 'This key has expired and no longer signs; rotate it or generate a new one.');
  return view.current;
}

/**
 * In a job: the lineage (still the caller's, or still granted to it), its current generation if it may
 * sign, and that generation's private key opened with the passphrase the job carries.
 */
export async function openSigningKey(
  c: Container,
  userId: string,
  lineageId: string,
  passphrase: string,
): Promise<{ lineage: LineageRow; current: KeyRow; privateKey: StoredPrivateKey }> {
  const found = await findLineage(c.db, lineageId);
  const current = found && (await lineageUsableBy(c.db, userId, found.id)) ? await activeGeneration(c.db, found.id) : undefined;
  if (!found || !current) throw invalid('key_not_found', 'The key no longer exists.');
  const lineage = verifiedLineage(c, found);
  signingTarget({ lineage, current: verifiedKey(c, current) }, c.clock.now());
  const unlock = await unlockLineage(c, lineage, passphrase);
  return { lineage, current, privateKey: await unlockGeneration(c, unlock, current) };
}

/** The latest time a job submitted at `now` may still be running: its wall-clock limit (JOB_TIMEOUT_SECONDS). */
export const jobDeadline = (c: Container, now: Date) => new Date(now.getTime() + c.config.jobLimits.timeoutMs);

/** Disables a key (audited once: a repeat changes nothing); answers its lineage and whether this call disabled it. */
export function disableKey(c: Container, userId: string, view: KeyView, meta: RequestMeta): Promise<{ lineage: LineageRow; changed: boolean }> {
  return c.db.transaction(async (trx) => {
    const row = await disableLineage(trx, view.lineage.id, c.clock.now());
    if (row)
      await recordAudit(
        trx,
        { user_id: userId, action: 'keys.disable', status: 'success', target: view.current.fingerprint, details: { label: view.lineage.label } },
        meta,
      );
    return row ? { lineage: row, changed: true } : { lineage: view.lineage, changed: false };
  });
}

/** A key use refused before any job (the key may not encrypt, sign...): audited under the action, with the refusal's code. */
export const auditKeyRefusal = (c: Container, userId: string, action: AuditAction, target: string | null, reason: string, meta: RequestMeta) =>
  recordAudit(c.db, { user_id: userId, action, status: 'failure', target, details: { reason } }, meta);

/** A page of the caller's keys (its own, and those team access grants it), with their current generation. */
export const keyPage = (c: Container, q: KeyListQuery) => listKeys(c.db, q);
