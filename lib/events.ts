import { setTimeout as sleep } from 'node:timers/promises';
import type { Knex } from 'knex';
import type { Container } from './container';
import { withinRedisBudget } from './redis';
import type { Write } from '../db/knex';
import { besideStream, publishEvents, type AccountEvent, type NewEvent, type Once, type Published } from './event-stream';
import type { EventType } from './event-names';
import { eventTargets, fanOut } from './webhooks/endpoints';
import { accountsWithPendingEvents, insertOutbox, outboxInsert, takePendingEvents, type NewOutboxRow } from '../db/event-outbox';

/** How long a relayed event's Redis key is kept: a relayer that published it but could not delete its row skips it. */
const RELAYED_ONCE_SECONDS = 24 * 3600;
const RELAY_BATCH = 100;
/** How long, in all, an emitter retries while another process relays the same account before leaving its events to it. */
const RELAY_WAIT_MS = 2000;
const RELAY_RETRY_MS = 50;

/**
 * Emits account events once the change they report has committed: they are stored in Postgres (the
 * outbox), then published to the account's stream in order and their webhook deliveries queued
 * (relayEvents). When Redis cannot be reached they wait in the outbox, and the event relay publishes
 * them when it can. A failure is logged, not thrown: the change has happened and must not turn into an
 * error.
 */
export async function emitEvents(c: Container, userId: string, events: NewEvent[], once?: Once): Promise<void> {
  if (!events.length) return;
  try {
    // A `once` key stands for one event: the rows of a call are stored together or not at all.
    if (once && events.length > 1) throw new TypeError('a once-only emit carries one event');
    await insertOutbox(c.db, outboxRows(c, userId, events, once));
  } catch (err) {
    c.log.warn({ err, types: events.map((e) => e.type) }, 'could not store account events');
    return;
  }
  await announceEvents(c, userId);
}

const outboxRows = (c: Container, userId: string, events: NewEvent[], once?: Once): NewOutboxRow[] => {
  const at = c.clock.now();
  return events.map((e) => ({ user_id: userId, type: e.type, data: e.data, once_key: once?.key ?? null, once_seconds: once?.seconds ?? null, created_at: at }));
};

/**
 * The outbox write of `events`, to commit with the change they report (in its transaction, or beside its
 * statement: db/knex.ts withWrites): the events exist exactly when the change does, for one commit less.
 * Once committed, announceEvents publishes them.
 */
export const storeEvents = (c: Container, db: Knex, userId: string, events: NewEvent[]): Write => outboxInsert(db, outboxRows(c, userId, events));

/** Publishes the account's committed events (emitEvents, storeEvents); failures are logged, and the events wait in the outbox. */
export const announceEvents = (c: Container, userId: string): Promise<void> => relayEvents(c, userId, RELAY_WAIT_MS);

/**
 * Publishes one event now, past the outbox, with a `once` key (see publishEvents): for a change whose own
 * row is durable already and that several processes hear (the audit relay), where an outbox row and its
 * relay would cost two more commits. It goes through the outbox only when Redis cannot take it.
 */
export async function publishEvent(c: Container, userId: string, event: NewEvent, at: Date, once: Once): Promise<void> {
  const answer = c.redis.status === 'ready' ? await publishEvents(c.redis, c.config.redisPrefix, userId, [event], at, once).catch(() => undefined) : undefined;
  if (answer === undefined) return emitEvents(c, userId, [event], once);
  // Null: published already (another process heard the same row).
  if (answer) await queueWebhooks(c, userId, event, at, answer);
}

/** Queues the webhooks of one published event; a failure is logged (the event itself is out). */
async function queueWebhooks(c: Container, userId: string, event: NewEvent, at: Date, answer: Published): Promise<void> {
  const published: AccountEvent = { id: answer.ids[0], type: event.type, created_at: at.toISOString(), account: userId, data: event.data };
  await fanOut(c, published, await eventTargets(c, userId, answer.endpointsVersion)).catch((err: unknown) =>
    c.log.warn({ err, type: event.type }, 'could not queue the webhooks of an account event'),
  );
}

/** One event: see emitEvents. `once`: see publishEvents. */
export const emitEvent = (c: Container, userId: string, type: EventType, data: Record<string, unknown>, once?: Once): Promise<void> =>
  emitEvents(c, userId, [{ type, data }], once);

/** The relay of each account running in this process: emitters that come meanwhile ask it to go round once more. */
interface Relay {
  again: boolean;
  done: Promise<void>;
}
const relaying = new WeakMap<Container, Map<string, Relay>>();

/**
 * Publishes the account's stored events, oldest first, each once (a Redis key per event, kept a day),
 * queues their webhooks, and deletes them from the outbox; stops where Redis fails (the rest wait).
 * One relayer per account: in this process, callers share the running one; across processes, an
 * account lock in Postgres, retried for up to `waitMs` without holding a connection meanwhile.
 */
function relayEvents(c: Container, userId: string, waitMs = 0): Promise<void> {
  let mine = relaying.get(c);
  if (!mine) relaying.set(c, (mine = new Map<string, Relay>()));
  const running = mine.get(userId);
  if (running) {
    running.again = true;
    // Its Redis waits are another caller's: a request waits for it within its own budget, and past that
    // leaves the events to it.
    return withinRedisBudget(running.done).catch(() => undefined);
  }
  const state = { again: false, done: Promise.resolve() };
  state.done = (async () => {
    try {
      do {
        state.again = false;
        await relayAccount(c, userId, waitMs);
      } while (state.again);
    } catch (err) {
      c.log.warn({ err }, 'could not relay account events; they wait in the outbox');
    } finally {
      mine.delete(userId);
    }
  })();
  mine.set(userId, state);
  return state.done;
}

async function relayAccount(c: Container, userId: string, waitMs: number): Promise<void> {
  const prefix = c.config.redisPrefix;
  const deadline = Date.now() + waitMs;
  for (;;) {
    if (c.redis.status !== 'ready') return;
    // The transaction holds one pooled connection and asks for no other (no query on c.db inside it), so a
    // full pool cannot deadlock on it; webhooks are queued once it has committed.
    const published: { event: NewEvent; at: Date; answer: Published }[] = [];
    let outcome: 'busy' | 'more' | 'done';
    try {
      outcome = await c.db.transaction(async (trx): Promise<'busy' | 'more' | 'done'> => {
        const rows = await takePendingEvents(trx, userId, RELAY_BATCH);
        if (!rows) return 'busy';
        for (const [i, row] of rows.entries()) {
          const once = {
            key: row.once_key ?? besideStream(prefix, userId, `outbox:${row.id}`, c.redis.isCluster),
            seconds: row.once_seconds ?? RELAYED_ONCE_SECONDS,
          };
          const event: NewEvent = { type: row.type as EventType, data: row.data };
          const answer = await publishEvents(c.redis, prefix, userId, [event], row.created_at, once).catch((err: unknown) => {
            throw new PublishFailed(err, rows.length - i);
          });
          // Null: published already (by another process hearing the same audit row, or before a rolled-back relay).
          if (answer) published.push({ event, at: row.created_at, answer });
        }
        return rows.length === RELAY_BATCH ? 'more' : 'done';
      });
    } catch (err) {
      if (!(err instanceof PublishFailed)) throw err;
      // The events are back in the outbox; those published already are skipped next time by their Redis key.
      c.log.warn({ err: err.cause, waiting: err.waiting }, 'could not publish account events; they wait in the outbox');
      outcome = 'done';
    }
    for (const { event, at, answer } of published) await queueWebhooks(c, userId, event, at, answer);
    if (outcome === 'done') return;
    if (outcome === 'busy') {
      // Another process relays this account; it may have read the outbox before these events were in it.
      if (Date.now() >= deadline) return;
      await sleep(RELAY_RETRY_MS);
    }
  }
}

/** Redis refused an event: the relay's transaction rolls back, so the account's events wait in the outbox again. */
class PublishFailed extends Error {
  constructor(
    cause: unknown,
    readonly waiting: number,
  ) {
    super('could not publish an account event', { cause });
  }
}

const RELAY_INTERVAL_MS = 2000;

/** Publishes events that could not be published when they were emitted (Redis was down), every two seconds. */
export function startEventRelay(c: Container): { stop: () => Promise<void> } {
  let running: Promise<void> | undefined;
  const tick = async () => {
    if (c.redis.status !== 'ready') return;
    const accounts = await accountsWithPendingEvents(c.db, RELAY_BATCH).catch(() => [] as string[]);
    for (const userId of accounts) await relayEvents(c, userId, 0);
  };
  const timer = setInterval(() => void (running ??= tick().finally(() => (running = undefined))), RELAY_INTERVAL_MS);
  timer.unref();
  return {
    async stop() {
      clearInterval(timer);
      await running;
    },
  };
}
