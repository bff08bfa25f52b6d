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
 * After a lost session, rows made from this long before the loss are looked at again: `created_at` is
 * its transaction's start, and a transaction begun before the loss may commit after it.
 */
const CATCH_UP_MARGIN_MS = 60_000;
const CATCH_UP_PAGE = 1000;
/** At most this many rows are caught up after one loss (well within DEDUPE_SECONDS of publications). */
const CATCH_UP_MAX_ROWS = 20_000;
/** The trigger's notice of a row (migration 007), built from the row itself for the catch-up. */
const NOTICE_SQL = `json_build_object('id', id, 'user_id', user_id, 'action', action, 'status', status, 'target', left(target, 200), 'created_at', created_at)::text`;

/**
 * Turns committed audit rows into `audit_logs.recorded` events, whatever code wrote them: Postgres sends a
 * notification per row at commit (never for a rolled-back one) and this relay publishes it. Every API
 * and scheduler process listens; a Redis SET NX per row id lets exactly one of them publish. A session
 * that is lost (a failover, a restarted server) hears nothing until it listens again, so the rows
 * committed meanwhile are read back once it does and relayed like notifications (those published
 * already are not published again).
 */
export function startAuditRelay(c: Container): { stop: () => Promise<void> } {
  let client: pg.Client | undefined;
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  /** When the listening session was lost, until the rows committed since have been caught up. */
  let lostAt: Date | undefined;

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
      if (lostAt) await catchUp(next, new Date(lostAt.getTime() - CATCH_UP_MARGIN_MS));
      lostAt = undefined;
    } catch (err) {
      c.log.warn({ err: (err as Error).message }, 'audit relay: cannot listen; retrying');
      void next.end().catch(() => undefined);
      retry();
    }
  };
  /** Relays the rows made since `since` (this session already hears the ones committed from now on). */
  const catchUp = async (session: pg.Client, since: Date) => {
    let relayed = 0;
    for (let after = 0; relayed < CATCH_UP_MAX_ROWS;) {
      const { rows } = await session.query<{ id: string; notice: string }>(
        `SELECT id, ${NOTICE_SQL} AS notice FROM audit_logs WHERE user_id IS NOT NULL AND created_at >= $1 AND id > $2 ORDER BY id LIMIT $3`,
        [since, after, CATCH_UP_PAGE],
      );
      for (const row of rows) await relay(row.notice);
      relayed += rows.length;
      if (rows.length < CATCH_UP_PAGE) break;
      after = Number(rows[rows.length - 1].id);
    }
    if (relayed) c.log.info({ rows: relayed, since }, 'audit relay: relayed the rows committed while it was not listening');
  };
  const retry = () => {
    if (stopped || timer) return;
    const old = client;
    // Only a session that listened leaves rows unheard; a catch-up not yet done keeps its earlier start.
    if (old) lostAt ??= new Date();
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
