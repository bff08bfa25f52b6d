import type { Container } from '../container';
import { conflict, notFound } from '../errors';
import { failedRotationsSince, healthCounts, keyHealthRow, keyMetrics, OVERDUE_AFTER } from '../../db/key-health';
import { FINGERPRINT } from '../pgp/profiles';
import { lineageIdsOfFingerprint, findLineage, lineageGenerations } from '../../db/keys';

/** Administrators' view of keys across accounts: health overview, one key's health, one key's metrics. */
const DAY = 86400_000;

export async function healthOverview(c: Container) {
  const now = c.clock.now();
  const [counts, failed] = await Promise.all([healthCounts(c.db, now), failedRotationsSince(c.db, new Date(now.getTime() - DAY))]);
  return { ...counts, failed_rotations_24h: failed, overdue_after: OVERDUE_AFTER };
}

/** How many holders of one fingerprint an ambiguous reference names. */
const AMBIGUOUS_SHOWN = 10;

/**
 * The lineage a key reference names: any generation's fingerprint (40 or 64 hex digits) or the lineage id. An
 * unknown fingerprint answers 404 `key_not_found`; one that several accounts hold (each may import the
 * same key) answers 409 `ambiguous_key` naming their lineage ids (administrators see every account).
 */
export async function lineageOf(c: Container, ref: string): Promise<string> {
  if (!FINGERPRINT.test(ref)) return ref;
  const lineageIds = await lineageIdsOfFingerprint(c.db, ref, AMBIGUOUS_SHOWN + 1);
  if (!lineageIds.length) throw notFound('key_not_found', 'No key with this fingerprint.');
  if (lineageIds.length > 1)
    throw conflict(
      'ambiguous_key',
      `Keys of several accounts have this fingerprint; name one by its lineage id: ${lineageIds.slice(0, AMBIGUOUS_SHOWN).join(', ')}${lineageIds.length > AMBIGUOUS_SHOWN ? ', …' : ''}.`,
    );
  return lineageIds[0];
}

export async function keyHealth(c: Container, lineageId: string) {
  const now = c.clock.now();
  const row = await keyHealthRow(c.db, lineageId);
  if (!row) throw notFound('key_not_found', 'No key with this id.');
  const state = row.disabled_at ? 'disabled' : row.expires_at && row.expires_at <= now ? 'expired' : 'active';
  const next = row.disabled_at ? null : row.next_rotation_at;
  const daysLeft = (d: Date | null) => (d ? Math.floor((d.getTime() - now.getTime()) / DAY) : null);
  return {
    lineage_id: row.lineage_id,
    account: row.user_id,
    label: row.label,
    fingerprint: row.fingerprint,
    generation: row.generation,
    status: state,
    rotation_interval_days: row.rotation_days,
    next_rotation_at: next?.toISOString() ?? null,
    rotation_due: Boolean(next && next <= now),
    rotation_overdue: Boolean(next && next.getTime() <= now.getTime() - 3600_000),
    expires_at: row.expires_at?.toISOString() ?? null,
    expires_in_days: daysLeft(row.expires_at),
    failed_rotations_24h: await failedRotationsSince(c.db, new Date(now.getTime() - DAY), row.lineage_id),
  };
}

export async function keyMetricsOf(c: Container, lineageId: string) {
  const lineage = await findLineage(c.db, lineageId);
  if (!lineage) throw notFound('key_not_found', 'No key with this id.');
  const generations = await lineageGenerations(c.db, lineageId);
  const metrics = await keyMetrics(
    c.db,
    lineageId,
    generations.map((g) => g.fingerprint),
    generations.map((g) => g.id),
  );
  const lastUsed = generations
    .map((g) => g.last_used_at)
    .filter((d): d is Date => Boolean(d))
    .sort((a, b) => b.getTime() - a.getTime())[0];
  return {
    lineage_id: lineage.id,
    account: lineage.user_id,
    label: lineage.label,
    operations: metrics.operations,
    bytes_processed: generations.reduce((n, g) => n + Number(g.bytes_count), 0),
    jobs_processed: generations.reduce((n, g) => n + Number(g.ops_count), 0),
    last_used_at: lastUsed?.toISOString() ?? null,
    rotations: metrics.rotations,
    generations: generations.map((g) => ({
      generation: g.generation,
      fingerprint: g.fingerprint,
      status: g.status,
      created_at: g.created_at.toISOString(),
      rotated_at: g.rotated_at?.toISOString() ?? null,
      jobs: Number(g.ops_count),
      bytes: Number(g.bytes_count),
      last_used_at: g.last_used_at?.toISOString() ?? null,
    })),
    job_latency: metrics.jobLatency,
  };
}
