import pg from 'pg';
import { z } from 'zod';
import type { Container } from './container';
import { publishEvent } from './events';
import { besideStream } from './event-stream';

/** What the audit_logs trigger sends (migration 007) for every committed row of an account. */
const Notice = z.object({ id: z.number(), user_id: z.uuid(), action: z.string(), status: z.string(), target: z.string().nullable(), created_at: z.string() });

const RECONNECT_MS = 2000;
/** How long a relayed row's id is remembered: every relay process hears every row, one publishes it. */
const DEDUPE_SECONDS = 3600;

/**
 * Turns committed audit rows into `audit_logs.recorded` events, whatever code wrote them: Postgres sends a
 * notification per row at commit (never for a rolled-back one) and this relay publishes it. Every API
 * and scheduler process listens; a Redis SET NX per row id lets exactly one of them publish.
 */
export function startAuditRelay(c: Container): { stop: () => Promise<void> } {
  let client: pg.Client | undefined;
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;

  const relay = async (payload: string | undefined) => {
    const parsed = Notice.safeParse(JSON.parse(payload ?? 'null'));
    if (!parsed.success) return;
    const row = parsed.data;
    const once = { key: besideStream(c.config.redisPrefix, row.user_id, `audit-relay:${row.id}`, c.redis.isCluster), seconds: DEDUPE_SECONDS };
    const data = { audit_id: row.id, action: row.action, status: row.status, target: row.target, recorded_at: new Date(row.created_at).toISOString() };
    await publishEvent(c, row.user_id, { type: 'audit_logs.recorded', data }, c.clock.now(), once);
  };

  const connect = async () => {
    if (stopped) return;
    // A session of its own on Postgres itself: a transaction-mode pooler would never deliver its notifications.
    const next = new pg.Client({ connectionString: c.config.databaseDirectUrl });
    next.on('notification', (n) => void relay(n.payload).catch((err: unknown) => c.log.warn({ err }, 'audit relay: could not publish')));
    next.on('error', (err) => {
      c.log.warn({ err: err.message }, 'audit relay: connection lost; reconnecting');
      retry();
    });
    try {
      await next.connect();
      await next.query('LISTEN audit_recorded');
      client = next;
    } catch (err) {
      c.log.warn({ err: (err as Error).message }, 'audit relay: cannot listen; retrying');
      void next.end().catch(() => undefined);
      retry();
    }
  };
  const retry = () => {
    if (stopped || timer) return;
    const old = client;
    client = undefined;
    void old?.end().catch(() => undefined);
    timer = setTimeout(() => {
      timer = undefined;
      void connect();
    }, RECONNECT_MS);
    timer.unref();
  };

  void connect();
  return {
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await client?.end().catch(() => undefined);
    },
  };
}
