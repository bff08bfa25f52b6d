import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import type { Container } from '../container';
import { conflict } from '../errors';
import { emitEvent, emitEvents } from '../events';
import { type NewEvent } from '../event-stream';
import { newGeneration, rekeyLineage, requireKey, requireManaged, type GenerationRow, type Rekeyed } from '../keys/key-catalog';
import { verifyKeyPassphrase } from '../keys/passphrases';
import { lineageMac, verifiedLineage } from '../keys/key-integrity';
import { defaultAlgorithm, type KeyAlgorithm, type KeyProfile } from '../pgp/profiles';
import { auditInsert, recordAudit } from '../../db/audit';
import type { JobOrigin } from '../../jobs/define';
import {
  updateLineage,
  storeRekeyedLineage,
  generationInsert,
  lineageGenerations,
  lineageWithActive,
  lockLineageWithGenerations,
  retireActive,
  type GenerationRef,
  type KeyView,
  type LineageRow,
} from '../../db/keys';
import type { RequestMeta } from '../../db/audit';
import { runWrites, type Write } from '../../db/knex';
import {
  insertRotation,
  listRotations,
  rotationInsert,
  succeededRotationFrom,
  type RotationQuery,
  type RotationRow,
  type RotationTrigger,
} from '../../db/rotation';

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
  /** Manual rotation may move the lineage to another OpenPGP profile: this generation and the next ones. */
  profile?: KeyProfile;
  /** The request that enqueued the rotation (null for the scheduler), recorded in its audit rows. */
  origin?: JobOrigin;
}

export type RotateOutcome = { rotated: true; entry: RotationRow } | { rotated: false; reason: 'already_rotated' | 'disabled' | 'gone'; entry?: RotationRow };

/**
 * What a requested ("rotate now") rotation needs before it is queued: the caller's key (404 otherwise,
 * audited as not_owner when it is another account's), not disabled (409), and, when the request gives a
 * current passphrase, that passphrase, through the one limited, audited check (422 `wrong_passphrase`,
 * 429 past the key's budget) rather than as a failed job later.
 */
export async function manualRotationTarget(
  c: Container,
  input: { userId: string; fingerprint: string; currentPassphrase?: string; meta: RequestMeta },
): Promise<KeyView> {
  const view = await requireKey(c, input.userId, input.fingerprint, input.meta);
  requireManaged(view.lineage);
  if (view.lineage.disabled_at) throw conflict('key_disabled', 'This key is disabled and is not rotated.');
  if (input.currentPassphrase !== undefined) {
    await verifyKeyPassphrase(c, { userId: input.userId, view, passphrase: input.currentPassphrase, action: 'keys.rotate', meta: input.meta });
  }
  return view;
}

const isUniqueViolation = (err: unknown) => (err as { code?: string }).code === '23505';

/** The next generation, made and sealed outside any transaction (key generation is the slow part). */
export interface PreparedRotation {
  /** As it will be once committed: with the profile the rotation moves it to. */
  lineage: LineageRow;
  current: GenerationRef;
  next: GenerationRow;
  rekeyed?: Rekeyed;
  /** The rotation changes the lineage's profile (stored with it, its MAC anew). */
  moved: boolean;
}

/** A rotation that has nothing to do: the lineage is gone, disabled, or already past `fromGeneration`. */
type Skipped = Extract<RotateOutcome, { rotated: false }>;

export const alreadyRotated = async (db: Knex, input: RotateInput): Promise<Skipped> => ({
  rotated: false,
  reason: 'already_rotated',
  entry: await succeededRotationFrom(db, input.lineageId, input.fromGeneration),
});

export async function prepareRotation(c: Container, input: RotateInput): Promise<PreparedRotation | Skipped> {
  const found = await lineageWithActive(c.db, input.lineageId);
  if (!found) return { rotated: false, reason: 'gone' };
  // The next generation is sealed to this lineage's unlock public key: it must be the one we stored.
  const lineage = verifiedLineage(c, found.lineage);
  const current = found.active;
  if (current.generation !== input.fromGeneration) return alreadyRotated(c.db, input);
  if (lineage.kind === 'recipient') {
    if (input.trigger === 'manual') requireManaged(lineage);
    return { rotated: false, reason: 'disabled' }; // a recipient key's generations are its owner's to make
  }
  if (lineage.disabled_at) {
    if (input.trigger === 'manual') throw conflict('key_disabled', 'This key is disabled and is not rotated.');
    return { rotated: false, reason: 'disabled' };
  }
  const moved = input.profile && input.profile !== lineage.profile ? { profile: input.profile, algorithm: defaultAlgorithm(input.profile) } : undefined;
  const target = moved ? { ...lineage, ...moved } : lineage;
  const rekeyed = input.passphrases ? await rekeyLineage(c, target, await lineageGenerations(c.db, lineage.id), input.passphrases) : undefined;
  const unlock_public = rekeyed?.unlock_public ?? lineage.unlock_public;
  const next = await newGeneration(c, { ...target, unlock_public, algorithm: target.algorithm as KeyAlgorithm }, current.generation + 1);
  return { lineage: target, current, next, rekeyed, moved: Boolean(moved) };
}

/** A switch made: its history row as it will be stored, and the writes still to run (see commitRotation). */
export interface CommittedRotation {
  entry: RotationRow;
  writes: Write[];
}

/**
 * The switch, in the caller's transaction: only if the lineage is still at `fromGeneration`, under its
 * row lock (undefined otherwise: another rotation won). The compare-and-swap that retires the current
 * generation runs here; the new generation, its history row and audit row are returned as writes, for the
 * caller to run in one statement with its own (a tracked job's: with its completed state).
 */
export async function commitRotation(c: Container, trx: Knex.Transaction, input: RotateInput, p: PreparedRotation): Promise<CommittedRotation | undefined> {
  const { lineage, current, next, rekeyed, moved } = p;
  const now = c.clock.now();
  if (!(await retireActive(trx, lineage.id, input.fromGeneration, now))) return undefined;
  if (rekeyed) {
    await storeRekeyedLineage(trx, lineage.id, rekeyed, now);
  }
  if (moved) {
    const unlock_mac = rekeyed?.unlock_mac ?? lineageMac(c, lineage);
    await updateLineage(trx, lineage.id, { profile: lineage.profile, algorithm: lineage.algorithm, unlock_mac, updated_at: now });
  }
  const audit = auditInsert(
    trx,
    {
      user_id: lineage.user_id,
      action: 'keys.rotate',
      status: 'success',
      target: current.fingerprint,
      details: {
        new_fingerprint: next.fingerprint,
        generation: next.generation,
        trigger: input.trigger,
        actor_id: input.actorId,
        passphrase_changed: Boolean(rekeyed),
        profile: next.profile,
        ...(input.jobId ? { job_id: input.jobId } : {}),
      },
    },
    input.origin,
  );
  // Its id and time made here: the writer reads nothing back.
  const entry: RotationRow = {
    id: randomUUID(),
    user_id: lineage.user_id,
    lineage_id: lineage.id,
    old_fingerprint: current.fingerprint,
    new_fingerprint: next.fingerprint,
    from_generation: current.generation,
    trigger: input.trigger,
    actor_id: input.actorId,
    status: 'succeeded',
    error: null,
    job_id: input.jobId ?? null,
    created_at: now,
  };
  return { entry, writes: [rotationInsert(trx, entry), generationInsert(trx, next), audit] };
}

/** The owner's event of a committed rotation. */
export const rotatedEvent = (lineage: LineageRow, entry: RotationRow): NewEvent => ({
  type: 'keys.rotated',
  data: {
    lineage_id: lineage.id,
    label: lineage.label,
    old_fingerprint: entry.old_fingerprint,
    new_fingerprint: entry.new_fingerprint,
    trigger: entry.trigger,
  },
});

/** A whole rotation in its own transaction (the scheduler's; a tracked job commits it with the job). */
export async function rotateLineage(c: Container, input: RotateInput): Promise<RotateOutcome> {
  const prepared = await prepareRotation(c, input);
  if (!('next' in prepared)) return prepared;
  let entry: RotationRow | undefined;
  try {
    entry = await c.db.transaction(async (trx) => {
      const committed = await commitRotation(c, trx, input, prepared);
      if (committed) await runWrites(committed.writes);
      return committed?.entry;
    });
  } catch (err) {
    if (isUniqueViolation(err)) return alreadyRotated(c.db, input);
    throw err;
  }
  if (!entry) return alreadyRotated(c.db, input);
  await emitEvents(c, prepared.lineage.user_id, [rotatedEvent(prepared.lineage, entry)]);
  return { rotated: true, entry };
}

/** A rotation that failed for good: history row, audit row (one transaction), and an event for the owner. */
export async function recordRotationFailure(c: Container, input: RotateInput, error: { code: string; message: string }, trx = c.db): Promise<void> {
  const found = await lineageWithActive(c.db, input.lineageId); // recording only: whatever state the rows are in
  if (!found) return;
  await insertRotation(trx, {
    user_id: found.lineage.user_id,
    lineage_id: found.lineage.id,
    old_fingerprint: found.active.fingerprint,
    new_fingerprint: null,
    from_generation: input.fromGeneration,
    trigger: input.trigger,
    actor_id: input.actorId,
    status: 'failed',
    error,
    job_id: input.jobId ?? null,
  });
  await recordAudit(
    trx,
    {
      user_id: found.lineage.user_id,
      action: 'keys.rotate',
      status: 'failure',
      target: found.active.fingerprint,
      details: { trigger: input.trigger, code: error.code, ...(input.jobId ? { job_id: input.jobId } : {}) },
    },
    input.origin,
  );
  await emitEvent(c, found.lineage.user_id, 'keys.rotation_failed', {
    lineage_id: found.lineage.id,
    fingerprint: found.active.fingerprint,
    trigger: input.trigger,
    code: error.code,
  });
}

export function rotationOut(r: RotationRow) {
  return {
    rotation_id: r.id,
    lineage_id: r.lineage_id,
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

export type RotationSchedule = Partial<Pick<LineageRow, 'rotation_mode' | 'rotation_interval_days' | 'profile'>>;

/**
 * Changes a lineage's schedule and/or the profile its next generations are made with. The profile is
 * under the lineage's MAC (lib/integrity.ts), made anew here from the row as locked, so a passphrase
 * change committing meanwhile is not undone.
 */
export function setRotationSchedule(c: Container, userId: string, view: KeyView, schedule: RotationSchedule, meta: RequestMeta): Promise<void> {
  return c.db.transaction(async (trx) => {
    const { lineage } = await lockLineageWithGenerations(trx, view.lineage.id);
    const moved = schedule.profile && schedule.profile !== lineage.profile ? { ...verifiedLineage(c, lineage), profile: schedule.profile } : undefined;
    const profile = moved ? { algorithm: defaultAlgorithm(moved.profile), unlock_mac: lineageMac(c, moved) } : {};
    await updateLineage(trx, lineage.id, { ...schedule, ...profile, updated_at: c.clock.now() });
    await recordAudit(trx, { user_id: userId, action: 'keys.schedule_rotation', status: 'success', target: view.current.fingerprint, details: schedule }, meta);
  });
}

/** A page of the account's rotations (of one lineage, or all), newest first. */
export const rotationHistory = (c: Container, q: RotationQuery) => listRotations(c.db, q);
