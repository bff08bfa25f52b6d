import type { Knex } from 'knex';

/**
 * Key health and metrics across accounts, for administrators. A lineage's next rotation is its current
 * generation's creation plus its interval ('interval' mode) or its owner's rotation_days ('policy').
 */
const NEXT_ROTATION = `k.created_at + make_interval(days => CASE l.rotation_mode WHEN 'interval' THEN l.rotation_interval_days WHEN 'policy' THEN u.rotation_days END)`;

/** Past due by more than this, a rotation is overdue: the sweep runs every minute. */
export const OVERDUE_AFTER = '1 hour';

const lineages = (db: Knex) =>
  db
    .from('key_lineages as l')
    .join('pgp_keys as k', function () {
      this.on('k.lineage_id', '=', 'l.id').andOnVal('k.status', '=', 'active');
    })
    .join('users as u', 'u.id', 'l.user_id')
    .whereNull('u.deleted_at');

export interface HealthCounts {
  total: number;
  active: number;
  disabled: number;
  expired: number;
  rotation_due: number;
  rotation_overdue: number;
  expiring_14d: number;
  expiring_30d: number;
}

export async function healthCounts(db: Knex, now: Date): Promise<HealthCounts> {
  const live = 'l.disabled_at IS NULL';
  const row = await lineages(db)
    .select(
      db.raw('count(*)::int AS total'),
      db.raw(`count(*) FILTER (WHERE ${live} AND (k.expires_at IS NULL OR k.expires_at > :now))::int AS active`, { now }),
      db.raw('count(*) FILTER (WHERE l.disabled_at IS NOT NULL)::int AS disabled'),
      db.raw(`count(*) FILTER (WHERE ${live} AND k.expires_at <= :now)::int AS expired`, { now }),
      db.raw(`count(*) FILTER (WHERE ${live} AND ${NEXT_ROTATION} <= :now)::int AS rotation_due`, { now }),
      db.raw(`count(*) FILTER (WHERE ${live} AND ${NEXT_ROTATION} <= :now::timestamptz - interval '${OVERDUE_AFTER}')::int AS rotation_overdue`, { now }),
      db.raw(`count(*) FILTER (WHERE ${live} AND k.expires_at > :now AND k.expires_at <= :now::timestamptz + interval '14 days')::int AS expiring_14d`, {
        now,
      }),
      db.raw(`count(*) FILTER (WHERE ${live} AND k.expires_at > :now AND k.expires_at <= :now::timestamptz + interval '30 days')::int AS expiring_30d`, {
        now,
      }),
    )
    .first<HealthCounts>();
  return row;
}

export const failedRotationsSince = async (db: Knex, since: Date, lineageId?: string): Promise<number> => {
  const q = db('rotation_history').where({ status: 'failed' }).where('created_at', '>', since);
  if (lineageId) q.andWhere({ lineage_id: lineageId });
  const [row] = await q.count<{ n: number }[]>({ n: '*' });
  return Number(row?.n ?? 0);
};

export interface KeyHealthRow {
  lineage_id: string;
  user_id: string;
  label: string;
  disabled_at: Date | null;
  fingerprint: string;
  generation: number;
  key_created_at: Date;
  expires_at: Date | null;
  rotation_days: number | null;
  next_rotation_at: Date | null;
}

export const keyHealthRow = async (db: Knex, lineageId: string): Promise<KeyHealthRow | undefined> =>
  lineages(db)
    .where('l.id', lineageId)
    .select(
      'l.id as lineage_id',
      'l.user_id',
      'l.label',
      'l.disabled_at',
      'k.fingerprint',
      'k.generation',
      'k.created_at as key_created_at',
      'k.expires_at',
      db.raw(`CASE l.rotation_mode WHEN 'interval' THEN l.rotation_interval_days WHEN 'policy' THEN u.rotation_days END AS rotation_days`),
      db.raw(`${NEXT_ROTATION} AS next_rotation_at`),
    )
    .first() as Promise<KeyHealthRow | undefined>;

export interface KeyMetrics {
  operations: { action: string; status: string; count: number }[];
  rotations: { status: string; count: number }[];
  jobLatency: { kind: string; count: number; p50_ms: number | null; p95_ms: number | null }[];
}

/**
 * Operations (audit rows of its generations' fingerprints), rotations, and its jobs' latencies. An
 * account that holds a copy of one of those fingerprints in a lineage of its own (an imported key)
 * writes its rows about that copy: they are left out. The owner's rows and those of accounts that used
 * the key through team access count.
 */
export async function keyMetrics(db: Knex, lineageId: string, fingerprints: string[], generationIds: string[]): Promise<KeyMetrics> {
  const [operations, rotations, jobLatency] = await Promise.all([
    db('audit_logs')
      .whereIn('action', ['keys.encrypt', 'keys.decrypt', 'keys.rotate', 'keys.generate', 'keys.disable'])
      .whereIn('target', fingerprints)
      .whereNotIn('user_id', db('pgp_keys').whereIn('fingerprint', fingerprints).whereNot('lineage_id', lineageId).select('user_id'))
      .select('action', 'status', db.raw('count(*)::int AS count'))
      .groupBy('action', 'status')
      .orderBy(['action', 'status']),
    db('rotation_history').where({ lineage_id: lineageId }).select('status', db.raw('count(*)::int AS count')).groupBy('status').orderBy('status'),
    db('jobs')
      .whereNotNull('finished_at')
      .where((q) => {
        q.whereRaw(`request->>'lineage_id' = ?`, [lineageId]).orWhereRaw(`request->'recipient'->>'key_id' = ANY(?)`, [generationIds]);
      })
      .select(
        'kind',
        db.raw('count(*)::int AS count'),
        db.raw(`round(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)) * 1000) AS p50_ms`),
        db.raw(`round(percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at)) * 1000) AS p95_ms`),
      )
      .groupBy('kind')
      .orderBy('kind'),
  ]);
  return {
    operations: operations as KeyMetrics['operations'],
    rotations: rotations as KeyMetrics['rotations'],
    jobLatency: (jobLatency as { kind: string; count: number; p50_ms: string | null; p95_ms: string | null }[]).map((r) => ({
      ...r,
      p50_ms: r.p50_ms === null ? null : Number(r.p50_ms),
      p95_ms: r.p95_ms === null ? null : Number(r.p95_ms),
    })),
  };
}
