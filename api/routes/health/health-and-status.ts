import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { route } from '../../route';
import { QUEUES } from '../../../jobs/define';
import { liveProcesses, type ProcessBeat } from '../../../lib/heartbeats';
import { Timestamp } from '../../schemas/common';
import type { Container } from '../../../lib/container';
import { within } from '../../../lib/within';
import { CHECK_MS, dependencyChecks, keyringOfProcesses, latestReseal, pingPostgres } from '../../../lib/operations/health-checks';
import { brokenChains } from '../../../lib/audit/signer-memory';

const Check = z.enum(['up', 'down']);

const VERSION = (JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version: string }).version;

/** How long a dependency takes to answer (ms), or null when it does not answer within CHECK_MS. */
async function latency(work: () => Promise<unknown>): Promise<number | null> {
  const started = process.hrtime.bigint();
  return within(work(), CHECK_MS).then(
    () => Math.round(Number(process.hrtime.bigint() - started) / 1e4) / 100,
    () => null,
  );
}

const Dependency = z.object({ state: z.enum(['up', 'down']), latency_ms: z.number().nullable() });
const QueueStatus = z.object({
  queue: z.enum(QUEUES),
  counts: z.object({ waiting: z.number().int(), active: z.number().int(), delayed: z.number().int(), failed: z.number().int(), completed: z.number().int() }),
  workers: z.number().int().describe('Live worker processes taking this queue'),
  concurrency: z.number().int().describe('Their summed concurrency'),
  schedulers: z.array(z.object({ scheduler_id: z.string(), every_ms: z.number().nullable(), next_run_at: Timestamp.nullable() })),
});
/** How many broken audit chains the status names (the count covers them all). */
const BROKEN_CHAINS_SHOWN = 20;

const Status = z
  .object({
    status: z.enum(['ok', 'degraded']).describe('degraded while Postgres or Redis is down or an audit chain is broken'),
    version: z.string(),
    uptime_seconds: z.number().int(),
    postgres: Dependency,
    redis: Dependency,
    queues: z.array(QueueStatus),
    workers: z.array(
      z.object({
        worker_id: z.string(),
        host: z.string(),
        pid: z.number().int(),
        queues: z.array(z.object({ queue: z.string(), concurrency: z.number().int() })),
        started_at: Timestamp,
        seen_at: Timestamp,
      }),
    ),
    master_key: z.object({
      root_id: z.string().describe('The root key that wraps the keyring (no secret): `master-key:<kid>` or `pkcs11:token=…;object=…`'),
      current_kid: z.string().describe('The data key new seals and row MACs use in this process'),
      reseal: z
        .object({
          target_kid: z.string(),
          resealed: z.number().int().describe('Values and row MACs moved to the target key'),
          skipped: z.number().int().describe('Values changed meanwhile, or that did not open (left as they were)'),
          started_at: Timestamp,
          updated_at: Timestamp,
          finished_at: Timestamp.nullable(),
        })
        .nullable()
        .describe('The latest re-seal run (`npm run admin -- master-key rotate`), null before the first'),
      processes: z
        .array(
          z.object({
            process_id: z.string(),
            host: z.string(),
            pid: z.number().int(),
            roles: z.array(z.string()),
            current_kid: z.string().nullable().describe('The data key the process seals under, as its heartbeat says (null: not said)'),
            reload_error: z.string().nullable().describe('Why its keyring reload fails, while it does'),
            behind: z.boolean().describe("It does not seal under the keyring's current data key (or does not say): `master-key retire` refuses meanwhile"),
          }),
        )
        .describe('Every live API, worker and scheduler process, with the data key it seals under'),
    }),
    audit_chains: z
      .object({
        broken: z.number().int().describe('Audit chains the checkpoint signer found broken and does not sign (docs/audit-evidence.md)'),
        chains: z.array(z.object({ chain: z.string(), sequence: z.number().int(), reason: z.string(), detected_at: Timestamp })),
      })
      .nullable()
      .describe('Null while Redis, where the signer keeps them, is down'),
  })
  .meta({ id: 'Status' });

async function queueStatus(c: Container, workers: ProcessBeat[]) {
  return Promise.all(
    QUEUES.map(async (name) => {
      const queue = c.jobs.queue(name);
      const [counts, schedulers] = await Promise.all([queue.getJobCounts('waiting', 'active', 'delayed', 'failed', 'completed'), queue.getJobSchedulers()]);
      const taking = workers.flatMap((w) => w.queues.filter((q) => q.queue === name));
      return {
        queue: name,
        counts: {
          waiting: counts.waiting ?? 0,
          active: counts.active ?? 0,
          delayed: counts.delayed ?? 0,
          failed: counts.failed ?? 0,
          completed: counts.completed ?? 0,
        },
        workers: taking.length,
        concurrency: taking.reduce((n, q) => n + q.concurrency, 0),
        schedulers: schedulers.map((s) => ({
          scheduler_id: s.key,
          every_ms: s.every ? Number(s.every) : null,
          next_run_at: s.next ? new Date(s.next).toISOString() : null,
        })),
      };
    }),
  );
}

/** Liveness is implied by any answer; readiness is the status code: 503 while Postgres or Redis is down. */
export default [
  route({
    method: 'get',
    path: '/health',
    summary: 'Health: 200 when the API and its dependencies (Postgres, Redis) answer, 503 otherwise',
    tags: ['Monitoring'],
    access: 'public',
    responses: {
      200: {
        description: 'Ready',
        schema: z.object({ status: z.enum(['ok', 'degraded']), checks: z.object({ postgres: Check, redis: Check }), uptime_seconds: z.number() }),
      },
      503: {
        description: 'A dependency is down',
        schema: z.object({ status: z.enum(['ok', 'degraded']), checks: z.object({ postgres: Check, redis: Check }), uptime_seconds: z.number() }),
      },
    },
    async handler({ c }) {
      const { postgres, redis } = await dependencyChecks(c);
      const ok = postgres === 'up' && redis === 'up';
      return {
        status: ok ? 200 : 503,
        headers: { 'Cache-Control': 'no-store' },
        body: { status: ok ? 'ok' : 'degraded', checks: { postgres, redis }, uptime_seconds: Math.round(process.uptime()) },
      };
    },
  }),

  route({
    method: 'get',
    path: '/status',
    summary: 'System status snapshot: version, uptime, Postgres and Redis latency, queues with their counts, workers and schedules',
    tags: ['Monitoring'],
    access: 'admin',
    responses: { 200: { description: 'The snapshot', schema: Status } },
    async handler({ c, reader }) {
      const [pg, redis] = await Promise.all([latency(() => pingPostgres(c)), latency(() => c.redis.ping())]);
      const beats = redis === null ? [] : await liveProcesses(c.redis, c.config.redisPrefix);
      const workers = beats.filter((b) => b.roles.includes('worker'));
      // The latency is the primary's; what it lists is read where a little lag is fine.
      const r = await reader();
      const reseal = pg === null ? undefined : await latestReseal(r);
      const processes = pg === null ? [] : await keyringOfProcesses(r, beats);
      const audit = redis === null ? null : await brokenChains(c, BROKEN_CHAINS_SHOWN);
      const degraded = pg === null || redis === null || (audit?.count ?? 0) > 0;
      return {
        headers: { 'Cache-Control': 'no-store' },
        body: {
          status: degraded ? 'degraded' : 'ok',
          version: VERSION,
          uptime_seconds: Math.round(process.uptime()),
          postgres: { state: pg === null ? 'down' : 'up', latency_ms: pg },
          redis: { state: redis === null ? 'down' : 'up', latency_ms: redis },
          queues: redis === null ? [] : await queueStatus(c, workers),
          workers: workers.map(({ id, host, pid, queues, started_at, seen_at }) => ({ worker_id: id, host, pid, queues, started_at, seen_at })),
          master_key: {
            root_id: c.keyring.roots.currentId,
            current_kid: c.keyring.current().kid,
            reseal: reseal
              ? {
                  target_kid: reseal.target_kid,
                  resealed: reseal.resealed,
                  skipped: reseal.skipped,
                  started_at: reseal.started_at.toISOString(),
                  updated_at: reseal.updated_at.toISOString(),
                  finished_at: reseal.finished_at?.toISOString() ?? null,
                }
              : null,
            processes,
          },
          audit_chains: audit && { broken: audit.count, chains: audit.chains },
        },
      };
    },
  }),
];
