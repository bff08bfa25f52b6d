import { z } from 'zod';
import { route } from '../../route';
import { Timestamp } from '../../schemas/common';
import { Fingerprint } from '../../schemas/key-fields';
import { healthOverview, keyHealth, keyMetricsOf, lineageOf } from '../../../lib/keys/key-health';

const tags = ['Monitoring'];

/** A PGP key: any generation's fingerprint, or its lineage id. */
const KeyRef = z.union([Fingerprint, z.uuid()]).describe("Any generation's fingerprint (or the key's `lineage_id`)");

const Overview = z.object({
  total: z.number().int(),
  active: z.number().int(),
  disabled: z.number().int(),
  expired: z.number().int(),
  rotation_due: z.number().int(),
  rotation_overdue: z.number().int().describe('Due for longer than `overdue_after`'),
  expiring_14d: z.number().int(),
  expiring_30d: z.number().int(),
  failed_rotations_24h: z.number().int(),
  overdue_after: z.string(),
});

const OneKey = z.object({
  lineage_id: z.uuid(),
  account: z.uuid(),
  label: z.string(),
  fingerprint: z.string(),
  generation: z.number().int(),
  status: z.enum(['active', 'disabled', 'expired']),
  rotation_interval_days: z.number().int().nullable().describe("The interval in effect: the key's own, or its owner's policy"),
  next_rotation_at: Timestamp.nullable(),
  rotation_due: z.boolean(),
  rotation_overdue: z.boolean(),
  expires_at: Timestamp.nullable(),
  expires_in_days: z.number().int().nullable(),
  failed_rotations_24h: z.number().int(),
});

const Metrics = z
  .object({
    lineage_id: z.uuid(),
    account: z.uuid(),
    label: z.string(),
    operations: z.array(z.object({ action: z.string(), status: z.string(), count: z.number().int() })).describe('From the audit log, by action and outcome'),
    bytes_processed: z.number().int(),
    jobs_processed: z.number().int(),
    last_used_at: Timestamp.nullable(),
    rotations: z.array(z.object({ status: z.string(), count: z.number().int() })),
    generations: z.array(
      z.object({
        generation: z.number().int(),
        fingerprint: z.string(),
        status: z.string(),
        created_at: Timestamp,
        rotated_at: Timestamp.nullable(),
        jobs: z.number().int(),
        bytes: z.number().int(),
        last_used_at: Timestamp.nullable(),
      }),
    ),
    job_latency: z
      .array(z.object({ kind: z.string(), count: z.number().int(), p50_ms: z.number().nullable(), p95_ms: z.number().nullable() }))
      .describe('Submit to finish, per job kind'),
  })
  .meta({ id: 'KeyMetrics' });

export default [
  route({
    method: 'get',
    path: '/keys/health',
    summary: 'Key health across accounts (states, rotations due and overdue, expiries, failed rotations), or one key with `key_id` (a fingerprint)',
    tags,
    access: 'admin',
    query: z.object({ key_id: KeyRef.optional() }),
    responses: { 200: { description: 'The overview, or the one key', schema: z.union([Overview, OneKey]) } },
    async handler({ query, reader }) {
      const r = await reader();
      return { body: query.key_id ? await keyHealth(r, await lineageOf(r, query.key_id)) : await healthOverview(r) };
    },
  }),

  route({
    method: 'get',
    path: '/keys/{key_id}/metrics',
    summary: "One key's metrics: operations by kind and outcome, bytes, last use, rotations, generations, job latencies",
    tags,
    access: 'admin',
    params: z.object({ key_id: KeyRef }),
    responses: { 200: { description: 'The metrics', schema: Metrics } },
    async handler({ c, params }) {
      return { body: await keyMetricsOf(c, await lineageOf(c, params.key_id)) };
    },
  }),
];
