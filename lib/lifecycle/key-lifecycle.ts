import type { Knex } from 'knex';
import type { Container } from '../container';
import { conflict, gone, invalid, notFound } from '../errors';
import { emitEvent } from '../events';
import { requireKey } from '../keys/key-catalog';
import { verifiedKey } from '../keys/key-integrity';
import { resyncLinkedTo } from '../teams/team-access';
import { recordAudit, type RequestMeta } from '../../db/audit';
import {
  updateLineage,
  unscheduleGenerations,
  setGenerationDestroyAfter,
  scheduleUnscheduledGenerations,
  lockLineageWithGenerations,
  lineagesWithDueGenerations,
  destroyGeneration,
  lineageGenerations,
  lineagesWithSpentTokenKey,
  markTokenKeyDeleted,
  type KeyRow,
  type LineageRow,
} from '../../db/keys';
import { lineageKeyLabel } from '../root-of-trust/lineage-keys';
import { jobsNeedingLineage } from '../../db/jobs';
import type { AuditAction } from '../event-names';

/**
 * Key lifecycle beyond rotation: retiring old generations (`min_decryption_generation`, as
 * Vault's `min_decryption_version`), destroying retired generations or whole keys after a waiting
 * period (as AWS KMS), and what still depends on each generation. Destruction is crypto-shredding: the
 * sealed private key and its secret are emptied; the public key, fingerprint and counters stay. A lineage
 * with a token key (LINEAGE_TOKEN_KEYS) loses that key once its last generation is destroyed, which shuts
 * the copies in database backups too (docs/root-of-trust.md).
 */

export type GenerationState = 'current' | 'rotated' | 'retired' | 'pending_destruction' | 'destroyed';

function generationState(
  lineage: Pick<LineageRow, 'min_decryption_generation'>,
  g: Pick<KeyRow, 'status' | 'generation' | 'destroy_after' | 'destroyed_at'>,
): GenerationState {
  if (g.destroyed_at) return 'destroyed';
  if (g.destroy_after) return 'pending_destruction';
  if (g.status === 'active') return 'current';
  return g.generation < lineage.min_decryption_generation ? 'retired' : 'rotated';
}

/**
 * Whether a generation may still open what was encrypted to it (decrypt, rewrap): 410
 * `generation_destroyed`, 409 `destruction_pending` (a scheduled destruction: cancel it first) or 409
 * `generation_retired` naming it (lower `min_decryption_generation` to use it again).
 */
export function requireDecryptable(lineage: Pick<LineageRow, 'min_decryption_generation'>, g: KeyRow): KeyRow {
  const state = generationState(lineage, g);
  const name = `Generation ${g.generation} (${g.fingerprint})`;
  if (state === 'destroyed') throw gone('generation_destroyed', `${name} of this key was destroyed; what was encrypted to it can no longer be decrypted.`);
  if (state === 'pending_destruction')
    throw conflict('destruction_pending', `${name} of this key is scheduled for destruction and no longer decrypts; cancel the destruction to use it.`);
  if (state === 'retired')
    throw conflict(
      'generation_retired',
      `${name} of this key is retired (min_decryption_generation is ${lineage.min_decryption_generation}); lower it in the key's settings to decrypt with it.`,
    );
  return g;
}

const DAY_MS = 86_400_000;

/** One generation as `GET /keys/{fingerprint}/generations` shows it (no private material). */
function generationOut(c: Container, lineage: LineageRow, g: KeyRow) {
  const state = generationState(lineage, g);
  const now = c.clock.now().getTime();
  // Quiet since the later of its rotation and its last decrypt: files encrypted just before a rotation
  // are still likely to be read, so a fresh rotation is not "safe" yet either.
  const quietSince = Math.max(g.rotated_at?.getTime() ?? 0, g.last_decrypt_at?.getTime() ?? 0);
  const safe = state === 'rotated' && now - quietSince >= c.config.keyLifecycle.retireSafeDays * DAY_MS;
  const iso = (d: Date | null) => d?.toISOString() ?? null;
  return {
    generation: g.generation,
    fingerprint: g.fingerprint,
    algorithm: g.algorithm,
    profile: g.profile,
    status: state,
    created_at: g.created_at.toISOString(),
    rotated_at: iso(g.rotated_at),
    expires_at: iso(g.expires_at),
    destroy_after: iso(g.destroy_after),
    destroyed_at: iso(g.destroyed_at),
    safe_to_retire: safe,
    usage: {
      files_encrypted: Number(g.encrypt_files),
      bytes_encrypted: Number(g.encrypt_bytes),
      files_decrypted: Number(g.decrypt_files),
      bytes_decrypted: Number(g.decrypt_bytes),
      last_decrypt_at: iso(g.last_decrypt_at),
      files_rewrapped_from: Number(g.rewrap_from_files),
      files_rewrapped_to: Number(g.rewrap_to_files),
    },
  };
}

function lifecycleOut(lineage: LineageRow, current: KeyRow) {
  return {
    lineage_id: lineage.id,
    fingerprint: current.fingerprint,
    current_generation: current.generation,
    min_decryption_generation: lineage.min_decryption_generation,
    disabled_at: lineage.disabled_at?.toISOString() ?? null,
    destroy_after: lineage.destroy_after?.toISOString() ?? null,
    destroyed_at: lineage.destroyed_at?.toISOString() ?? null,
  };
}

/**
 * A page of the key's generations, newest first, with their state and usage. Team members may read it.
 * `from`: where the generations are read (a route's reader); the key named, whose refusal is audited, is looked up in `c`.
 */
export async function listGenerations(
  c: Container,
  userId: string,
  fingerprint: string,
  q: { page: number; pageSize: number },
  meta: RequestMeta,
  from: Container = c,
) {
  const view = await requireKey(c, userId, fingerprint, meta, 'read');
  const all = await lineageGenerations(from.db, view.lineage.id);
  const generations = all.slice((q.page - 1) * q.pageSize, q.page * q.pageSize).map((g) => verifiedKey(c, g));
  return {
    ...lifecycleOut(view.lineage, view.current),
    items: generations.map((g) => generationOut(c, view.lineage, g)),
    page: q.page,
    page_size: q.pageSize,
    total: all.length,
  };
}

/** The lineage and its generations, locked for a lifecycle change (one change at a time per key). */
async function lockedKey(trx: Knex.Transaction, lineageId: string) {
  const { lineage, generations } = await lockLineageWithGenerations(trx, lineageId);
  return { lineage, generations, current: generations.find((g) => g.status === 'active')! };
}

const audit = (trx: Knex.Transaction, userId: string, meta: RequestMeta, action: AuditAction, target: string, details: Record<string, unknown>) =>
  recordAudit(trx, { user_id: userId, action, status: 'success', target, details }, meta);

/**
 * `min_decryption_generation`: 1 up to the current generation (which is never retired). Lowering it
 * again is allowed while the generations it brings back exist: a destroyed one is 410, one scheduled
 * for destruction is 409 `destruction_pending` (cancel that first).
 */
export async function updateKeySettings(c: Container, userId: string, fingerprint: string, body: { min_decryption_generation?: number }, meta: RequestMeta) {
  const view = await requireKey(c, userId, fingerprint, meta, 'manage');
  return c.db.transaction(async (trx) => {
    const { lineage, generations, current } = await lockedKey(trx, view.lineage.id);
    if (lineage.destroyed_at) throw gone('key_destroyed', 'This key was destroyed.');
    const next = body.min_decryption_generation;
    if (next === undefined || next === lineage.min_decryption_generation) return lifecycleOut(lineage, current);
    if (next > current.generation) {
      throw invalid(
        'invalid_generation',
        `min_decryption_generation may be at most the current generation (${current.generation}): the current generation is never retired.`,
        [{ path: 'min_decryption_generation', message: `at most ${current.generation}` }],
      );
    }
    for (const g of generations.filter((g) => g.generation >= next && g.generation < lineage.min_decryption_generation)) {
      if (g.destroyed_at) throw gone('generation_destroyed', `Generation ${g.generation} (${g.fingerprint}) was destroyed and cannot be brought back.`);
      if (g.destroy_after)
        throw conflict('destruction_pending', `Generation ${g.generation} (${g.fingerprint}) is scheduled for destruction; cancel that first.`);
    }
    const row = await updateLineage(trx, lineage.id, { min_decryption_generation: next, updated_at: c.clock.now() });
    await audit(trx, userId, meta, 'keys.update_settings', current.fingerprint, {
      min_decryption_generation: { from: lineage.min_decryption_generation, to: next },
    });
    return lifecycleOut(row, current);
  });
}

export const DESTRUCTION_WAIT_DAYS = { min: 7, max: 30, default: 30 } as const;

/** The generation named in a destruction request: 404 when there is none, 410 once destroyed. */
function liveGeneration(generations: KeyRow[], n: number): KeyRow {
  const g = generations.find((x) => x.generation === n);
  if (!g) throw notFound('generation_not_found', `This key has no generation ${n}.`);
  if (g.destroyed_at) throw gone('generation_destroyed', `Generation ${g.generation} was destroyed already.`);
  return g;
}

/**
 * Schedules destruction after `waitingDays`: of one retired generation (409 `generation_not_retired`
 * otherwise), or, without `generation`, of the whole key, which is disabled at once (a cancel leaves it
 * disabled, as disabling is final). The `maintenance` sweep destroys when the wait is over.
 */
export async function scheduleDestruction(
  c: Container,
  userId: string,
  fingerprint: string,
  body: { generation?: number; waiting_days: number },
  meta: RequestMeta,
) {
  const view = await requireKey(c, userId, fingerprint, meta, 'manage');
  const now = c.clock.now();
  const when = new Date(now.getTime() + body.waiting_days * DAY_MS);
  const out = await c.db.transaction(async (trx) => {
    const { lineage, generations, current } = await lockedKey(trx, view.lineage.id);
    if (lineage.destroyed_at) throw gone('key_destroyed', 'This key was destroyed.');
    if (body.generation !== undefined) {
      const g = liveGeneration(generations, body.generation);
      if (g.destroy_after)
        throw conflict('destruction_already_scheduled', `Generation ${g.generation} is already scheduled for destruction (${g.destroy_after.toISOString()}).`);
      if (generationState(lineage, g) !== 'retired') {
        throw conflict(
          'generation_not_retired',
          `Generation ${g.generation} is not retired: raise min_decryption_generation above it first (the current generation is destroyed only with the whole key).`,
        );
      }
      await setGenerationDestroyAfter(trx, g.id, when);
      await audit(trx, userId, meta, 'keys.schedule_destruction', g.fingerprint, {
        scope: 'generation',
        generation: g.generation,
        destroy_after: when.toISOString(),
      });
      return { scope: 'generation' as const, generation: g.generation, fingerprint: g.fingerprint, newlyDisabled: false, lineage, current };
    }
    if (lineage.destroy_after)
      throw conflict('destruction_already_scheduled', `This key is already scheduled for destruction (${lineage.destroy_after.toISOString()}).`);
    const row = await updateLineage(trx, lineage.id, { destroy_after: when, disabled_at: lineage.disabled_at ?? now, updated_at: now });
    // Generations already scheduled on their own keep their (earlier or later) date.
    await scheduleUnscheduledGenerations(trx, lineage.id, when);
    await audit(trx, userId, meta, 'keys.schedule_destruction', current.fingerprint, {
      scope: 'key',
      generations: generations.filter((g) => !g.destroyed_at).length,
      destroy_after: when.toISOString(),
    });
    if (!lineage.disabled_at) await audit(trx, userId, meta, 'keys.disable', current.fingerprint, { label: lineage.label, reason: 'destruction_scheduled' });
    return { scope: 'key' as const, generation: null, fingerprint: current.fingerprint, newlyDisabled: !lineage.disabled_at, lineage: row, current };
  });
  const data = { lineage_id: view.lineage.id, fingerprint: out.fingerprint, scope: out.scope, generation: out.generation, destroy_after: when.toISOString() };
  await emitEvent(c, userId, 'keys.destruction_scheduled', data);
  if (out.newlyDisabled) {
    await emitEvent(c, userId, 'keys.disabled', { lineage_id: view.lineage.id, fingerprint: out.current.fingerprint, label: out.lineage.label });
    await resyncLinkedTo(c, userId, 'keys.disabled', meta);
  }
  return {
    scope: out.scope,
    generation: out.generation,
    fingerprint: out.fingerprint,
    destroy_after: when.toISOString(),
    key: lifecycleOut(out.lineage, out.current),
  };
}

/** Cancels a scheduled destruction (409 `destruction_not_scheduled` when there is none; 410 once done). */
export async function cancelDestruction(c: Container, userId: string, fingerprint: string, body: { generation?: number }, meta: RequestMeta) {
  const view = await requireKey(c, userId, fingerprint, meta, 'manage');
  const out = await c.db.transaction(async (trx) => {
    const { lineage, generations, current } = await lockedKey(trx, view.lineage.id);
    if (lineage.destroyed_at) throw gone('key_destroyed', 'This key was destroyed.');
    if (body.generation !== undefined) {
      const g = liveGeneration(generations, body.generation);
      if (!g.destroy_after) throw conflict('destruction_not_scheduled', `Generation ${g.generation} is not scheduled for destruction.`);
      if (lineage.destroy_after && g.destroy_after.getTime() === lineage.destroy_after.getTime()) {
        throw conflict('key_destruction_scheduled', 'This generation goes with the whole key: cancel the key’s destruction (without `generation`).');
      }
      await setGenerationDestroyAfter(trx, g.id, null);
      await audit(trx, userId, meta, 'keys.cancel_destruction', g.fingerprint, { scope: 'generation', generation: g.generation });
      return { scope: 'generation' as const, generation: g.generation, fingerprint: g.fingerprint, lineage, current };
    }
    if (!lineage.destroy_after) throw conflict('destruction_not_scheduled', 'This key is not scheduled for destruction.');
    await unscheduleGenerations(trx, lineage.id, lineage.destroy_after);
    const row = await updateLineage(trx, lineage.id, { destroy_after: null, updated_at: c.clock.now() });
    await audit(trx, userId, meta, 'keys.cancel_destruction', current.fingerprint, { scope: 'key' });
    return { scope: 'key' as const, generation: null, fingerprint: current.fingerprint, lineage: row, current };
  });
  await emitEvent(c, userId, 'keys.destruction_cancelled', {
    lineage_id: view.lineage.id,
    fingerprint: out.fingerprint,
    scope: out.scope,
    generation: out.generation,
  });
  return { scope: out.scope, generation: out.generation, fingerprint: out.fingerprint, key: lifecycleOut(out.lineage, out.current) };
}

/**
 * The maintenance sweep: destroys every generation whose wait is over. Each lineage is handled under
 * its row lock and each generation with a conditional update (`destroyed_at IS NULL`), so any number of
 * sweeps and schedulers destroy (and announce) a generation once. A lineage with a queued or running job
 * that needs it is left for a later sweep.
 */
export async function destroyDueGenerations(c: Container, limit = 200): Promise<{ destroyed: number; postponed: number }> {
  const now = c.clock.now();
  const due = await lineagesWithDueGenerations(c.db, now, limit);
  let destroyed = 0;
  let postponed = 0;
  for (const lineage_id of due) {
    const done = await c.db.transaction(async (trx) => {
      const { lineage, generations } = await lockedKey(trx, lineage_id);
      const ripe = generations.filter((g) => !g.destroyed_at && g.destroy_after && g.destroy_after <= now);
      if (!ripe.length) return [];
      if (
        await jobsNeedingLineage(
          trx,
          lineage.id,
          generations.map((g) => g.id),
        )
      ) {
        postponed++;
        return [];
      }
      const gone: KeyRow[] = [];
      for (const g of ripe) {
        const row = await destroyGeneration(trx, g.id, now);
        if (!row) continue;
        gone.push(row);
        await recordAudit(trx, {
          user_id: lineage.user_id,
          action: 'keys.destroy_generation',
          status: 'success',
          target: g.fingerprint,
          details: { lineage_id: lineage.id, generation: g.generation, scheduled_for: g.destroy_after!.toISOString() },
        });
      }
      const left = generations.filter((g) => !g.destroyed_at && !gone.some((x) => x.id === g.id));
      if (lineage.destroy_after && !left.length) await updateLineage(trx, lineage.id, { destroyed_at: now, updated_at: now });
      return gone.map((g) => ({
        user: lineage.user_id,
        lineage_id: lineage.id,
        fingerprint: g.fingerprint,
        generation: g.generation,
        whole: Boolean(lineage.destroy_after) && !left.length,
      }));
    });
    for (const d of done) {
      destroyed++;
      await emitEvent(c, d.user, 'keys.generation_destroyed', {
        lineage_id: d.lineage_id,
        fingerprint: d.fingerprint,
        generation: d.generation,
        key_destroyed: d.whole,
      });
    }
  }
  await deleteSpentTokenKeys(c, limit);
  return { destroyed, postponed };
}

/**
 * Deletes the token key of every lineage whose generations are all destroyed, after the commit that
 * destroyed the last one (a rollback never finds its key gone). A delete that fails is logged and tried
 * again by the next sweep; one already done (another sweep, or before a crash) counts as done.
 * Answers how many it recorded as deleted.
 */
export async function deleteSpentTokenKeys(c: Container, limit = 200): Promise<number> {
  let deleted = 0;
  for (const lineage of await lineagesWithSpentTokenKey(c.db, limit)) {
    try {
      const outcome = await c.lineageKeys.remove(lineage.id);
      await c.db.transaction(async (trx) => {
        if (!(await markTokenKeyDeleted(trx, lineage.id, c.clock.now()))) return;
        deleted++;
        await recordAudit(trx, {
          user_id: lineage.user_id,
          action: 'keys.delete_token_key',
          status: 'success',
          target: lineage.id,
          details: { label: lineageKeyLabel(lineage.id), found: outcome === 'deleted' },
        });
      });
    } catch (err) {
      c.log.warn(
        { lineage_id: lineage.id, err: err instanceof Error ? err.message : String(err) },
        'deleting the token key of a destroyed lineage failed; the next sweep tries again',
      );
    }
  }
  return deleted;
}
