import type { Logger } from './logger';
import { isRedisUnreachable, isSocketFailure } from './errors';

/** How often a process that still cannot reach Redis says so again. */
const REMINDER_MS = 30_000;

/** What a Redis connection lets one watch: its errors and its coming back. */
interface Watched {
  on(event: 'error', listener: (err: Error) => void): unknown;
  on(event: 'ready', listener: () => void): unknown;
}

/**
 * One process's account of Redis out of reach, shared by everything that hears of it: its connections'
 * errors (each reconnection attempt is one), BullMQ's errors about them (one per queue and connection),
 * and periodic work that fails for it. The loss is logged once, then a reminder every REMINDER_MS with
 * how many errors were heard meanwhile, and once more when a connection is ready again; a process down
 * for a minute writes four lines, not one per error. An error that is not a lost Redis is the caller's
 * to log.
 */
export class RedisOutageLog {
  private lostAt?: number;
  private saidAt = 0;
  private errors = 0;

  constructor(
    private readonly log: Logger,
    private readonly reminderMs = REMINDER_MS,
  ) {}

  /**
   * Counts `err` when it says Redis is out of reach (true: logged here, when it is the first or a
   * reminder is due); false for any other error, which the caller logs itself.
   */
  heard(err: unknown, source: string): boolean {
    if (!isRedisUnreachable(err) && !isSocketFailure(err)) return false;
    const now = Date.now();
    const message = err instanceof Error ? err.message : String(err);
    this.errors++;
    if (this.lostAt === undefined) {
      this.lostAt = this.saidAt = now;
      this.errors = 0;
      this.log.error({ source, err: message }, 'redis is out of reach; retrying');
    } else if (now - this.saidAt >= this.reminderMs) {
      this.log.warn({ source, err: message, down_ms: now - this.lostAt, errors: this.errors }, 'redis is still out of reach');
      this.saidAt = now;
      this.errors = 0;
    }
    return true;
  }

  /** A connection is ready: the outage, if one was logged, is over. */
  ready(): void {
    if (this.lostAt === undefined) return;
    this.log.info({ down_ms: Date.now() - this.lostAt, errors: this.errors }, 'redis is reachable again');
    this.lostAt = undefined;
  }

  /** A connection's errors go through `heard` (others are logged as `message`), its readiness to `ready`. */
  watch(connection: Watched, source: string, message: string): void {
    connection.on('error', (err: Error) => {
      if (!this.heard(err, source)) this.log.warn({ source, err: err.message }, message);
    });
    connection.on('ready', () => this.ready());
  }
}
