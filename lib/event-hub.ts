import type { Logger } from './logger';
import type { RedisOutageLog } from './redis-outage';
import { compareEventIds, eventStream, lastEventId, readEvents, streamTag, toEvent, type AccountEvent } from './event-stream';
import { connectRedis, createRedis, sameServer, serverOf, type Redis, type RedisTarget, type SingleRedis } from './redis';

/** How long one XREAD blocks; listeners that join meanwhile interrupt it (CLIENT UNBLOCK). */
const BLOCK_MS = 10_000;
/** Re-sent while the reader has not yet picked up a new stream: an UNBLOCK can overtake a read in flight. */
const UNBLOCK_RETRIES_MS = [0, 20, 100, 500, 2000];
/**
 * How long a stream stays in the read after its last listener has left: an account that waits for its
 * jobs one after another (`Prefer: wait`) then joins the read already under way, where a new stream
 * costs an interruption (CLIENT UNBLOCK, and the XREAD sent again).
 */
const LINGER_MS = 30_000;

interface Listener {
  /** The last event id this listener has been given. */
  cursor: string;
  deliver(events: AccountEvent[]): void;
  /** While it catches up with what the hub already read: live events held back here, in order. */
  held?: AccountEvent[];
}

interface Stream {
  /** Where the hub reads this stream from next (exclusive). */
  cursor: string;
  listeners: Set<Listener>;
  /** Set while the stream has no listener: ends it after LINGER_MS. */
  linger?: NodeJS.Timeout;
}

interface HubDeps {
  redis: Redis;
  target: RedisTarget;
  redisPrefix: string;
  log: Logger;
  outage: RedisOutageLog;
}

/**
 * Every live event stream of one process on ONE blocking Redis connection: a single XREAD BLOCK over
 * all streams with listeners, each from where the hub has read it, instead of a connection per open
 * SSE client. Each listener gets every event after its own cursor exactly once and in order, however
 * it joins (before, after or while the hub reads its stream). On a Redis Cluster one XREAD may only
 * name keys of one slot: there the hub keeps one such reader per stream group (lib/events.ts
 * `streamTag`) that has listeners.
 */
export class EventHub {
  private readonly groups = new Map<string, GroupReader>();
  private stopped = false;

  constructor(private readonly deps: HubDeps) {}

  /**
   * Follows an account's stream after `cursor` (exclusive), or without one from now: from where the hub
   * has read a stream it already follows (everything newer reaches the listener; no round trip), else
   * from the stream's newest id. Returns the function that stops it.
   */
  listen(userId: string, cursor: string | undefined, deliver: (events: AccountEvent[]) => void): Promise<() => void> {
    if (this.stopped) return Promise.resolve(() => undefined);
    const cluster = this.deps.redis.isCluster;
    const tag = cluster ? streamTag(this.deps.redisPrefix, userId, true) : '';
    let group = this.groups.get(tag);
    if (!group)
      this.groups.set(tag, (group = new GroupReader(this.deps, cluster ? `${this.deps.redisPrefix}:event-hub:${tag}` : `${this.deps.redisPrefix}:event-hub`)));
    return group.listen(userId, cursor, deliver);
  }

  /** Ends the readers; listeners get nothing more. */
  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all([...this.groups.values()].map((g) => g.stop()));
  }
}

/** The streams one XREAD can follow (all of them on one server; one group's on a cluster), on one connection. */
class GroupReader {
  private readonly streams = new Map<string, Stream>();
  private reader?: Redis;
  /** The reader's connection id, and the server it is on (CLIENT UNBLOCK goes there). */
  private readerId?: { server: SingleRedis; id: number };
  private running?: Promise<void>;
  private stopped = false;
  private wake?: () => void;
  /** Bumped when the set of streams changes; `readGeneration` is the one the current read was built from. */
  private generation = 0;
  private readGeneration = 0;

  constructor(
    private readonly deps: HubDeps,
    private readonly connectionName: string,
  ) {}

  async listen(userId: string, cursor: string | undefined, deliver: (events: AccountEvent[]) => void): Promise<() => void> {
    const from = cursor ?? this.streams.get(userId)?.cursor ?? (await lastEventId(this.deps.redis, this.deps.redisPrefix, userId));
    const listener: Listener = { cursor: from, deliver };
    let stream = this.streams.get(userId);
    if (!stream) {
      stream = { cursor: from, listeners: new Set([listener]) };
      this.streams.set(userId, stream);
      this.start();
      void this.interrupt();
    } else {
      clearTimeout(stream.linger);
      stream.linger = undefined;
      stream.listeners.add(listener);
      if (compareEventIds(stream.cursor, from) > 0) await this.catchUp(userId, listener, stream.cursor);
    }
    const joined = stream;
    return () => {
      joined.listeners.delete(listener);
      if (joined.listeners.size || joined.linger) return;
      joined.linger = setTimeout(() => {
        if (!joined.listeners.size && this.streams.get(userId) === joined) this.streams.delete(userId);
      }, LINGER_MS).unref();
    };
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const stream of this.streams.values()) clearTimeout(stream.linger);
    this.streams.clear();
    this.wake?.();
    this.reader?.disconnect();
    await this.running?.catch(() => undefined);
  }

  /** The hub already read past the listener's cursor: read up to there, holding back live events meanwhile. */
  private async catchUp(userId: string, listener: Listener, upTo: string): Promise<void> {
    listener.held = [];
    try {
      let after = listener.cursor;
      while (compareEventIds(after, upTo) < 0) {
        const batch = (await readEvents(this.deps.redis, this.deps.redisPrefix, userId, after)).filter((e) => compareEventIds(e.id, upTo) <= 0);
        if (!batch.length) break;
        this.pass(listener, batch);
        after = batch[batch.length - 1].id;
      }
    } finally {
      const held = listener.held;
      listener.held = undefined;
      this.pass(listener, held);
    }
  }

  /** What the reader hands a listener: held back while it catches up. */
  private give(listener: Listener, events: AccountEvent[]): void {
    if (listener.held) listener.held.push(...events);
    else this.pass(listener, events);
  }

  private pass(listener: Listener, events: AccountEvent[]): void {
    const fresh = events.filter((e) => compareEventIds(e.id, listener.cursor) > 0);
    if (!fresh.length) return;
    listener.cursor = fresh[fresh.length - 1].id;
    listener.deliver(fresh);
  }

  private start(): void {
    this.wake?.();
    if (this.running || this.stopped) return;
    // Named, so an operator (and a test) can tell the readers of a process in CLIENT LIST.
    this.reader = createRedis(this.deps.target, 'worker', { connectionName: this.connectionName });
    this.deps.outage.watch(this.reader, 'event hub', 'event hub: redis connection error');
    this.running = this.loop();
  }

  /** Makes a blocked read start over with the current streams (a new one would wait BLOCK_MS otherwise). */
  private async interrupt(): Promise<void> {
    const wanted = ++this.generation;
    for (const ms of UNBLOCK_RETRIES_MS) {
      if (ms) await new Promise((r) => setTimeout(r, ms));
      if (this.stopped || this.readGeneration >= wanted) return;
      const reading = this.readerId;
      if (reading)
        await sameServer(this.deps.redis, reading.server)
          ?.client('UNBLOCK', reading.id)
          .catch(() => undefined);
    }
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      if (!this.streams.size) {
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = undefined;
        continue;
      }
      try {
        const users = [...this.streams.keys()];
        const keys = users.map((u) => eventStream(this.deps.redisPrefix, u, this.deps.redis.isCluster));
        // The server that holds the group's slot (it changes when a cluster fails over): known once connected.
        await connectRedis(this.reader!);
        const server = serverOf(this.reader!, keys[0]);
        if (!server) throw new Error("no server holds the event streams' slot yet");
        if (this.readerId?.server !== server) {
          this.readerId = { server, id: Number(await server.client('ID')) };
          // A new connection to the server has a new id.
          server.once('ready', () => this.readerId?.server === server && (this.readerId = undefined));
        }
        this.readGeneration = this.generation;
        const cursors = users.map((u) => this.streams.get(u)!.cursor);
        const answer = await this.reader!.xread('COUNT', 100, 'BLOCK', BLOCK_MS, 'STREAMS', ...keys, ...cursors);
        for (const [key, entries] of answer ?? []) {
          const userId = users[keys.indexOf(key)];
          const stream = this.streams.get(userId);
          if (!stream || !entries.length) continue;
          const events = entries.map((e) => toEvent(userId, e));
          const last = events[events.length - 1].id;
          if (compareEventIds(last, stream.cursor) > 0) stream.cursor = last;
          for (const listener of stream.listeners) this.give(listener, events);
        }
      } catch (err) {
        if (this.stopped) return;
        this.readerId = undefined;
        if (!this.deps.outage.heard(err, 'event hub')) this.deps.log.warn({ err: (err as Error).message }, 'event hub: read failed; retrying');
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  }
}
