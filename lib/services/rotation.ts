import type { Container } from '../container';
import { conflict } from '../errors';
import { emitEvent } from '../events';
import { newGeneration, rekeyLineage, requireKey } from './keys';
import { verifyKeyPassphrase } from './passphrases';
import { verifiedLineage } from './key-integrity';
import { resyncLinkedTo } from './team-access';
import { recordAudit } from '../../db/audit';
import { insertKey, lineageGenerations, type KeyRow, type KeyView, type LineageRow } from '../../db/keys';
import type { RequestMeta } from '../../db/audit';
import { insertRotation, succeededRotationFrom, type RotationRow, type RotationTrigger } from '../../db/rotation';

/**
 * Rotation makes the next generation of a lineage and retires the current one to `rotated` (it still
 * decrypts, never encrypts). The new key is generated outside the transaction; the switch (old → rotated,
 * new → active, history, audit, an optional new passphrase) is one transaction that first checks the
 * lineage is still at `fromGeneration`, so retries, racing schedulers and crashed workers produce
 * exactly one rotation per generation (backed by unique indexes).
 */
export interface RotateInput {
  lineageId: string;
  /** The generation being rotated away from; a lineage already past it is left alone. */
  fromGeneration: number;
  trigger: RotationTrigger;
  actorId: string | null;
  jobId?: string;
  /** Manual rotation may also change the passphrase (the current one is required). */
  passphrases?: { current: string; next: string };
  /** The request that enqueued the rotation (null for the scheduler), recorded in its audit rows. */
  origin?: { request_id: string | null; ip: string | null };
}

export type RotateOutcome = { rotated: true; entry: RotationRow } | { rotated: false; reason: 'already_rotated' | 'disabled' | 'gone'; entry?: RotationRow };

/**
 * What a requested ("rotate now") rotation needs before it is queued: the caller's key (404 otherwise,
 * audited as not_owner when it is another account's), not disabled (409), and, when the request gives a
 * current passphrase, that passphrase, through the one limited, audited check (422 `wrong_passphrase`,
 * 429 past the key's budget) rather than as a failed job later.
 */
export async function manualRotationTarget(c: Container, input: { userId: string; fingerprint: string; currentPassphrase?: string; meta: RequestMeta }): Promise<KeyView> {
  const view = await requireKey(c, input.userId, input.fingerprint, input.meta);
  if (view.lineage.disabled_at) throw conflict('key_disabled', 'This key is disabled and is not rotated.');
  if (input.currentPassphrase !== undefined) {
    await verifyKeyPassphrase(c, { userId: input.userId, view, passphrase: input.currentPassphrase, action: 'keys.rotate', meta: input.meta });
  }
  return view;
}

const isUniqueViolation = (err: unknown) => (err as { code?: string }).code === '23505';

async function currentOf(c: Container, lineageId: string, verify = true) {
  const lineage = await c.db<LineageRow>('key_lineages').where({ id: lineageId }).first();
  const current = lineage && (await c.db<KeyRow>('pgp_keys').where({ lineage_id: lineageId, status: 'active' }).first());
  // The next generation is sealed to this lineage's unlock public key: it must be the one we stored.
  return lineage && current ? { lineage: verify ? verifiedLineage(c, lineage) : lineage, current } : undefined;
}

export async function rotateLineage(c: Container, input: RotateInput): Promise<RotateOutcome> {
  const found = await currentOf(c, input.lineageId);
  if (!found) return { rotated: false, reason: 'gone' };
  const { lineage, current } = found;
  const done = async (): Promise<RotateOutcome> => ({ rotated: false, reason: 'already_rotated', entry: await succeededRotationFrom(c.db, lineage.id, input.fromGeneration) });
  if (current.generation !== input.fromGeneration) return done();
  if (lineage.disabled_at) {
    if (input.trigger === 'manual') throw conflict('key_disabled', 'This key is disabled and is not rotated.');
    return { rotated: false, reason: 'disabled' };
  }

  const rekeyed = input.passphrases ? await rekeyLineage(c, lineage, await lineageGenerations(c.db, lineage.id), input.passphrases) : undefined;
  const unlock_public = rekeyed?.unlock_public ?? lineage.unlock_public;
  const next = await newGeneration(c, { ...lineage, unlock_public, algorithm: lineage.algorithm as Parameters<typeof newGeneration>[1]['algorithm'] }, current.generation + 1);
  const now = c.clock.now();
  let entry: RotationRow;
  try {
    entry = await c.db.transaction(async (trx) => {
      const locked = await trx<LineageRow>('key_lineages').where({ id: lineage.id }).forUpdate().first();
      const still = await trx<KeyRow>('pgp_keys').where({ lineage_id: lineage.id, status: 'active' }).first();
      if (!locked || still?.generation !== input.fromGeneration) return undefined;
      await trx('pgp_keys').where({ id: current.id }).update({ status: 'rotated', rotated_at: now });
      const created = await insertKey(trx, next);
      if (rekeyed) {
        await trx('key_lineages').where({ id: lineage.id }).update({ unlock_public, unlock_locked: rekeyed.unlock_locked, unlock_mac: rekeyed.unlock_mac, updated_at: now });
        for (const g of rekeyed.secrets) await trx('pgp_keys').where({ id: g.id }).update({ secret_sealed: g.secret_sealed });
      }
      const row = await insertRotation(trx, {
        user_id: lineage.user_id,
        lineage_id: lineage.id,
        old_fingerprint: current.fingerprint,
        new_fingerprint: created.fingerprint,
        from_generation: current.generation,
        trigger: input.trigger,
        actor_id: input.actorId,
        status: 'succeeded',
        error: null,
        job_id: input.jobId ?? null,
      });
      await recordAudit(trx, {
        ...input.origin,
        user_id: lineage.user_id,
        action: 'keys.rotate',
        status: 'success',
        target: current.fingerprint,
        details: { new_fingerprint: created.fingerprint, generation: created.generation, trigger: input.trigger, actor_id: input.actorId, passphrase_changed: Boolean(rekeyed), ...(input.jobId ? { job_id: input.jobId } : {}) },
      });
      return row;
    }) as RotationRow;
  } catch (err) {
    if (isUniqueViolation(err)) return done();
    throw err;
  }
  if (!entry) return done();
  await emitEvent(c, lineage.user_id, 'key.rotated', { key_id: lineage.id, label: lineage.label, old_fingerprint: entry.old_fingerprint, new_fingerprint: entry.new_fingerprint, trigger: entry.trigger });
  await resyncLinkedTo(c, lineage.user_id, 'key.rotated', { requestId: input.origin?.request_id ?? undefined, ip: input.origin?.ip ?? undefined });
  return { rotated: true, entry };
}

/** A rotation that failed for good: history row, audit row (one transaction), and an event for the owner. */
export async function recordRotationFailure(c: Container, input: RotateInput, error: { code: string; message: string }, trx = c.db): Promise<void> {
  const found = await currentOf(c, input.lineageId, false); // recording only: whatever state the rows are in
  if (!found) return;
  await insertRotation(trx, {
    user_id: found.lineage.user_id,
    lineage_id: found.lineage.id,
    old_fingerprint: found.current.fingerprint,
    new_fingerprint: null,
    from_generation: input.fromGeneration,
    trigger: input.trigger,
    actor_id: input.actorId,
    status: 'failed',
    error,
    job_id: input.jobId ?? null,
  });
  await recordAudit(trx, { ...input.origin, user_id: found.lineage.user_id, action: 'keys.rotate', status: 'failure', target: found.current.fingerprint, details: { trigger: input.trigger, code: error.code, ...(input.jobId ? { job_id: input.jobId } : {}) } });
  await emitEvent(c, found.lineage.user_id, 'key.rotation_failed', { key_id: found.lineage.id, fingerprint: found.current.fingerprint, trigger: input.trigger, code: error.code });
}

export function rotationOut(r: RotationRow) {
  return {
    id: r.id,
    key_id: r.lineage_id,
    old_fingerprint: r.old_fingerprint,
    new_fingerprint: r.new_fingerprint,
    from_generation: r.from_generation,
    trigger: r.trigger,
    actor_id: r.actor_id,
    status: r.status,
    error: r.error,
    job_id: r.job_id,
    created_at: r.created_at.toISOString(),
  };
}
