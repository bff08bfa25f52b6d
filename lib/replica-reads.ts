import type { Db } from '../db/knex';
import { currentWalLsn, replayPosition } from '../db/replication';
import type { Logger } from './logger';
import type { Redis } from './redis';
import { within } from './within';

/** How long one reading of the replica's replay position serves every read of this process. */
const SAMPLE_MS = 200;
/** A reading that takes longer counts as a failure: the replica does not answer. */
const SAMPLE_TIMEOUT_MS = 2000;
/** How long a replica that failed is left alone before it is read again (in the background, never by a request). */
const RETRY_MS = 5000;
/**
 * How much longer than the lag bound a caller's write is remembered. Past the bound no read leaves the
 * primary, so the bound alone would do, but for two things: the replica measures its lag with its own
 * clock against the primary's commit times, and commit times follow WAL order only roughly.
 */
const WRITTEN_SLACK_MS = 5000;

/** LSNs are stored as 16 hex digits, so that Lua compares them as strings (a Lua number loses bits above 2^53). */
const lsnText = (lsn: bigint) => lsn.toString(16).padStart(16, '0');

/** Stores ARGV[1] (an LSN) for ARGV[2] ms unless a higher one is stored, whose expiry is renewed instead. */
const RECORD_LUA = `local cur = redis.call('GET', KEYS[1])
if cur and cur >= ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`;

type WithScripts = Redis & { kmsRecordWrittenLsn(key: string, lsn: string, ttlMs: string): Promise<number> };

function scripts(redis: Redis): WithScripts {
  if (!('kmsRecordWrittenLsn' in redis)) redis.defineCommand('kmsRecordWrittenLsn', { numberOfKeys: 1, lua: RECORD_LUA });
  return redis as WithScripts;
}

interface Sample {
  replayed: bigint;
  lagMs: number;
  /** When it was read (Date.now()). */
  at: number;
}

export interface ReplicaReadsOptions {
  primary: Db;
  /** DATABASE_REPLICA_URL's pool; undefined: every read is the primary's and nothing is recorded. */
  replica: Db | undefined;
  redis: Redis;
  redisPrefix: string;
  maxLagMs: number;
  log: Logger;
}

/**
 * Which database a read that tolerates a little lag goes to: the one decision every route that may leave
 * the primary takes (api/route.ts `reader`). Read-your-own-writes: after a caller's request that may
 * write, the primary's WAL position is kept per caller (session or API key) in Redis; a read goes to the
 * replica only when the replica has replayed past that position and its replay lags less than the bound,
 * and to the primary otherwise, or when the replica or Redis fails. The replica's position is read at most
 * once per SAMPLE_MS per process, not per read. Without a replica this makes no query and no Redis call.
 */
export class ReplicaReads {
  private sample: Sample | undefined;
  private sampling: Promise<Sample | undefined> | undefined;
  /** Set while the replica is failing: no request waits on it, a background reading tries it again after this. */
  private retryAt = 0;
  private failing = false;
  private recordingFailed = false;
  /** After a write whose position could not be recorded, this process reads the primary until then. */
  private primaryUntil = 0;

  constructor(private readonly o: ReplicaReadsOptions) {}

  get configured(): boolean {
    return this.o.replica !== undefined;
  }

  private writtenKey = (principal: string) => `${this.o.redisPrefix}:replica:written:${principal}`;

  /** The database a read by `principal` (none: a public request) goes to. */
  async readDb(principal: string | undefined): Promise<Db> {
    const { replica, primary, maxLagMs } = this.o;
    if (!replica) return primary;
    if (Date.now() < this.primaryUntil) return primary;
    const [written, sample] = await Promise.all([this.written(principal), this.current()]);
    if (!sample || written === 'unknown') return primary;
    if (sample.lagMs + (Date.now() - sample.at) >= maxLagMs) return primary;
    // Replay only moves forward, so a reading from before the caller's write is below it (the primary was
    // past that reading when the write began) and sends the read to the primary, however recent it is.
    if (written !== null && sample.replayed < written) return primary;
    return replica;
  }

  /** `c` as a read by `principal` sees it: with the replica as its `db` where readDb chooses it, else `c` itself. */
  async readerOf<C extends { db: Db }>(c: C, principal: string | undefined): Promise<C> {
    const db = await this.readDb(principal);
    return db === c.db ? c : { ...c, db };
  }

  /**
   * After a request by `principal` that may have written: the primary's WAL position, kept for the lag
   * bound (and some slack). Never throws: a failure is logged (once until it works again), and this
   * process then reads only the primary for as long as the position would have been kept; the caller's
   * reads through another process may miss the write until the lag bound has passed.
   */
  async wrote(principal: string): Promise<void> {
    if (!this.o.replica) return;
    const keepMs = this.o.maxLagMs + WRITTEN_SLACK_MS;
    try {
      const lsn = await currentWalLsn(this.o.primary);
      await scripts(this.o.redis).kmsRecordWrittenLsn(this.writtenKey(principal), lsnText(lsn), String(keepMs));
      if (this.recordingFailed) this.o.log.info('the WAL positions of writes are recorded again');
      this.recordingFailed = false;
    } catch (err) {
      if (!this.recordingFailed)
        this.o.log.warn(
          { err: (err as Error).message },
          "a write's WAL position could not be recorded; reads may miss it until the replica lag bound has passed",
        );
      this.recordingFailed = true;
      this.primaryUntil = Date.now() + keepMs;
    }
  }

  /**
   * A read handed the replica failed (and runs again on the primary): the replica counts as failing, as
   * when a reading of it fails, so that a replica whose queries keep failing costs no read a second query.
   */
  failed(err: unknown): void {
    this.o.log.debug({ err: (err as Error).message }, 'a read on the database replica failed; it runs again on the primary');
    this.fails(err);
  }

  private fails(err: unknown): void {
    if (!this.failing) this.o.log.warn({ err: (err as Error).message }, 'the database replica fails; every read goes to the primary until it answers');
    this.failing = true;
    this.retryAt = Date.now() + RETRY_MS;
    this.sample = undefined;
  }

  private async written(principal: string | undefined): Promise<bigint | null | 'unknown'> {
    if (!principal) return null;
    try {
      const value = await this.o.redis.get(this.writtenKey(principal));
      return value === null ? null : BigInt(`0x${value}`);
    } catch {
      return 'unknown'; // Redis down: whether the caller wrote is not known, so the primary answers
    }
  }

  /** A fresh reading of the replica, or undefined while it fails. */
  private current(): Promise<Sample | undefined> {
    const now = Date.now();
    if (this.sample && now - this.sample.at < SAMPLE_MS) return Promise.resolve(this.sample);
    if (this.failing) {
      if (now >= this.retryAt && !this.sampling) void this.read();
      return Promise.resolve(undefined);
    }
    return this.sampling ?? this.read();
  }

  private read(): Promise<Sample | undefined> {
    const replica = this.o.replica!;
    const at = Date.now();
    this.sampling = within(replayPosition(replica), SAMPLE_TIMEOUT_MS)
      .then(({ replayed, lagSeconds }) => {
        if (replayed === null) throw new Error('DATABASE_REPLICA_URL leads to a server that is not a standby (not in recovery)');
        const sample = { replayed, lagMs: lagSeconds === null ? Infinity : lagSeconds * 1000, at };
        if (this.failing) this.o.log.info('the database replica answers again; reads that tolerate lag go to it');
        this.failing = false;
        this.sample = sample;
        return sample;
      })
      .catch((err: unknown) => {
        this.fails(err);
        return undefined;
      })
      .finally(() => (this.sampling = undefined));
    return this.sampling;
  }
}
