import { createHash, timingSafeEqual } from 'node:crypto';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { JobClient } from '../jobs/client';
import type { Logger } from './logger';
import { QUEUES } from '../jobs/define';

/**
 * Prometheus metrics of one process (prom-client). The API serves its registry at `GET /metrics`, a
 * worker process on its own port (workers/health-server.ts); with every role in one process (`npm
 * start`) one registry holds it all. Labels are bounded sets (route templates, queue and job names,
 * outcomes), never ids or raw paths.
 */
export interface Metrics {
  registry: Registry;
  httpRequests: Counter<'method' | 'route' | 'status'>;
  httpDuration: Histogram<'method' | 'route' | 'status'>;
  jobs: Counter<'queue' | 'job' | 'outcome'>;
  jobDuration: Histogram<'queue' | 'job' | 'outcome'>;
  /** Plaintext bytes that went through completed encrypt and decrypt jobs. */
  bytes: Counter<'operation'>;
  /** Job counts per queue and state, read from Redis when scraped (set by whoever can read the queues). */
  queueJobs: Gauge<'queue' | 'state'>;
  /** Untrusted OpenPGP work stopped at its deadline or out of memory (lib/pgp/untrusted.ts), by task. */
  untrustedStopped: Counter<'task' | 'why'>;
  /** Keyring reloads that failed (the process keeps sealing under the keys it knows). */
  keyringReloadFailures: Counter;
  /** 1 while this process's latest keyring reload failed, else 0. */
  keyringReloadFailing: Gauge;
  /** Runs of the checkpoint signer that found an audit chain broken and did not sign it, by chain kind (account, system). */
  auditChainBreaks: Counter<'chain'>;
}

export function createMetrics(): Metrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const registers = [registry];
  return {
    registry,
    httpRequests: new Counter({
      name: 'kms_http_requests_total',
      help: 'HTTP requests by route template and status',
      labelNames: ['method', 'route', 'status'],
      registers,
    }),
    httpDuration: new Histogram({
      name: 'kms_http_request_duration_seconds',
      help: 'HTTP request latency until the handler answers (a streamed body: until it starts)',
      labelNames: ['method', 'route', 'status'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120],
      registers,
    }),
    jobs: new Counter({
      name: 'kms_jobs_total',
      help: 'Job attempts by queue, job kind and outcome (completed, failed, retried)',
      labelNames: ['queue', 'job', 'outcome'],
      registers,
    }),
    jobDuration: new Histogram({
      name: 'kms_job_duration_seconds',
      help: 'Job attempt duration by queue, job kind and outcome',
      labelNames: ['queue', 'job', 'outcome'],
      buckets: [0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 7200],
      registers,
    }),
    bytes: new Counter({ name: 'kms_crypto_bytes_total', help: 'Plaintext bytes of completed encrypt and decrypt jobs', labelNames: ['operation'], registers }),
    untrustedStopped: new Counter({
      name: 'kms_untrusted_work_stopped_total',
      help: 'Keys and signatures from callers whose reading was stopped at its deadline or out of memory, by task',
      labelNames: ['task', 'why'],
      registers,
    }),
    keyringReloadFailures: new Counter({
      name: 'kms_keyring_reload_failures_total',
      help: 'Keyring reloads that failed; the process keeps sealing under the data keys it had',
      registers,
    }),
    keyringReloadFailing: new Gauge({
      name: 'kms_keyring_reload_failing',
      help: '1 while the latest keyring reload of this process failed (it may seal under a data key that is no longer current)',
      registers,
    }),
    auditChainBreaks: new Counter({
      name: 'kms_audit_chain_breaks_total',
      help: 'Audit chains the checkpoint signer found broken and refused to sign, once per chain and run, by chain kind (account, system)',
      labelNames: ['chain'],
      registers,
    }),
    queueJobs: new Gauge({
      name: 'kms_queue_jobs',
      help: 'Jobs per queue and state (waiting, active, delayed, failed, completed)',
      labelNames: ['queue', 'state'],
      registers,
    }),
  };
}

const QUEUE_STATES = ['waiting', 'active', 'delayed', 'failed', 'completed'] as const;

/** The registry's text, with queue depths read from Redis at scrape time (a dead Redis leaves them stale). */
export async function scrapeMetrics(c: { metrics: Metrics; jobs: Pick<JobClient, 'queue'>; log: Logger }): Promise<{ contentType: string; body: string }> {
  try {
    await Promise.all(
      QUEUES.map(async (queue) => {
        const counts = await c.jobs.queue(queue).getJobCounts(...QUEUE_STATES);
        for (const state of QUEUE_STATES) c.metrics.queueJobs.set({ queue, state }, counts[state] ?? 0);
      }),
    );
  } catch (err) {
    c.log.warn({ err: (err as Error).message }, 'metrics: queue depths unavailable');
  }
  return { contentType: c.metrics.registry.contentType, body: await c.metrics.registry.metrics() };
}

/**
 * Whether a `/metrics` request may see the metrics: METRICS_TOKEN must be set (else the endpoint does
 * not exist: 404) and sent as a Bearer token, compared in constant time.
 */
export function metricsAccess(token: string | undefined, authorization: string | undefined): 200 | 401 | 404 {
  if (!token) return 404;
  const sent = /^Bearer\s+(\S+)$/i.exec(authorization ?? '')?.[1] ?? '';
  const a = createHash('sha256').update(sent).digest();
  const b = createHash('sha256').update(token).digest();
  return timingSafeEqual(a, b) ? 200 : 401;
}
