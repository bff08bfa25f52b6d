import { PassThrough } from 'node:stream';
import { z } from 'zod';
import { route } from '../../route';
import { PageQuery, Timestamp, instant, pageOf } from '../../schemas/common';
import { invalid } from '../../../lib/errors';
import type { Container } from '../../../lib/container';
import { EVENT_ID, eventHistory, lastEventId, readEvents, trimmedSince, type AccountEvent } from '../../../lib/event-stream';
import { EVENT_TYPES, currentEventType, type EventType } from '../../../lib/event-names';

const tags = ['Events'];

const Event = z
  .object({
    id: z.string().describe('Increasing; send it back as Last-Event-ID to resume'),
    type: z.enum(EVENT_TYPES),
    created_at: Timestamp,
    account: z.uuid().describe('The account (user id) the event belongs to'),
    data: z.record(z.string(), z.unknown()).describe('Ids, fingerprints and states; never secrets'),
  })
  .meta({ id: 'Event' });

const Types = z
  .string()
  .max(1000)
  .transform((s) =>
    s
      .split(',')
      .map((t) => currentEventType(t.trim()))
      .filter(Boolean),
  )
  .pipe(z.array(z.enum(EVENT_TYPES)))
  .describe('Comma-separated event types to receive (default: all)');

/** How long a quiet stream waits before a heartbeat comment (proxies close idle connections). */
const HEARTBEAT_MS = 15_000;
/** Reconnection advice to EventSource clients. */
const RETRY_MS = 3000;

/** Open event streams of this process. */
const open = new Set<() => void>();
/** Ends every open stream, so that the server need not wait for them (clients reconnect to another process). */
export function endEventStreams(): void {
  for (const end of [...open]) end();
}

const frame = (e: AccountEvent) => `id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`;

/**
 * Replays what the client missed (after `resume`), then follows the account's stream live through the
 * process's event hub, so any API process serves any client. A resume point older than what the
 * stream still holds is said (`event: gap`) rather than skipped silently.
 */
async function pump(c: Container, userId: string, out: PassThrough, resume: string | undefined, types: EventType[] | undefined, stopped: { value: boolean }) {
  const prefix = c.config.redisPrefix;
  const send = (events: AccountEvent[]) => {
    for (const e of events) if (!types?.length || types.includes(e.type)) out.write(frame(e));
  };
  out.write(`retry: ${RETRY_MS}\n\n`);
  let cursor = resume ?? (await lastEventId(c.redis, prefix, userId));
  if (resume && (await trimmedSince(c.redis, prefix, userId, resume))) {
    out.write(
      `event: gap\ndata: ${JSON.stringify({ last_event_id: resume, reason: 'events after this id were trimmed; use GET /events/history or resync' })}\n\n`,
    );
  }
  for (let batch = await readEvents(c.redis, prefix, userId, cursor); batch.length; batch = await readEvents(c.redis, prefix, userId, cursor)) {
    send(batch);
    cursor = batch[batch.length - 1].id;
  }
  if (stopped.value) return;
  const unlisten = await c.eventHub.listen(userId, cursor, send);
  // Proxies close connections that stay quiet: a comment every HEARTBEAT_MS keeps the stream open.
  const heartbeat = setInterval(() => out.write(': heartbeat\n\n'), HEARTBEAT_MS);
  const stop = () => {
    clearInterval(heartbeat);
    unlisten();
  };
  if (stopped.value) stop();
  else out.once('close', stop);
}

export default [
  route({
    method: 'get',
    path: '/events',
    summary: "The account's events as Server-Sent Events: live, resumable with Last-Event-ID, with heartbeats",
    tags,
    access: 'auth',
    scope: 'events:read',
    query: z.object({
      types: Types.optional(),
      last_event_id: z.string().regex(EVENT_ID).optional().describe('Resume point for clients that cannot send the Last-Event-ID header'),
    }),
    responses: {
      200: {
        description:
          'text/event-stream: `id`, `event` (the type) and `data` (the Event envelope) per event; `event: gap` when a resume point is older than what is kept',
        schema: z.string(),
        contentType: 'text/event-stream',
      },
    },
    async handler({ c, ctx, user, query, log }) {
      const header = ctx.get('last-event-id') || undefined;
      if (header && !EVENT_ID.test(header))
        throw invalid('validation_failed', 'Last-Event-ID must be an event id such as 1700000000000-0.', [
          { path: 'headers.last-event-id', message: 'not an event id' },
        ]);
      const resume = header ?? query.last_event_id;
      ctx.req.socket.setTimeout(0);
      ctx.req.socket.setNoDelay(true);
      ctx.status = 200;
      ctx.type = 'text/event-stream';
      ctx.set('Cache-Control', 'no-cache, no-transform');
      ctx.set('X-Accel-Buffering', 'no'); // nginx: do not buffer the stream
      const out = new PassThrough();
      const stopped = { value: false };
      const end = () => {
        stopped.value = true;
        out.end();
      };
      open.add(end);
      out.once('close', () => {
        stopped.value = true;
        open.delete(end);
      });
      ctx.req.once('close', end);
      ctx.body = out;
      pump(c, user.id, out, resume, query.types, stopped).catch((err: unknown) => {
        if (!stopped.value) log.warn({ err }, 'event stream ended with an error');
        end();
      });
    },
  }),

  route({
    method: 'get',
    path: '/events/history',
    summary: "The account's stored events, newest first (the stream keeps the newest ~1000)",
    tags,
    access: 'auth',
    scope: 'events:read',
    query: PageQuery.extend({ types: Types.optional(), from: instant.optional(), to: instant.optional() }),
    responses: { 200: { description: 'A page of events', schema: pageOf(Event) } },
    async handler({ c, user, query }) {
      if (query.from && query.to && query.from > query.to) throw invalid('validation_failed', '`from` must not be after `to`.');
      const all = await eventHistory(c.redis, c.config.redisPrefix, user.id, { types: query.types, from: query.from, to: query.to });
      const start = (query.page - 1) * query.page_size;
      return { body: { items: all.slice(start, start + query.page_size), page: query.page, page_size: query.page_size, total: all.length } };
    },
  }),
];
