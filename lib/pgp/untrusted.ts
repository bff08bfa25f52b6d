import { AppError, invalid } from '../errors';
import type { Metrics } from '../metrics';
import { ThreadPool, threadModule, type Stopped } from '../thread-pool';
import type { tasks } from './untrusted-thread';

type Tasks = typeof tasks;
type Task = keyof Tasks;

/**
 * OpenPGP data a caller sends, read and checked on threads of their own (lib/thread-pool.ts): a key
 * whose checks or unlocking would cost more than `deadlineMs` is stopped there and refused (422), and
 * the process's event loop (health checks, logins, other jobs) never waits for it. import.ts bounds what
 * a key may ask for (packets, subkeys, RSA size and exponent, S2K counts and Argon2 parameters), so an
 * honest key meets the deadline with room to spare; the deadline stops whatever the bounds missed.
 */
export interface UntrustedOptions {
  threads: number;
  maxQueued: number;
  deadlineMs: number;
}

/** Heap of one thread: a key is at most MAX_PUBLIC_KEY_BYTES; parsing and checking it needs a few dozen MiB. */
const HEAP_MB = 128;
/** An idle thread ends after this (its memory goes back); the next task starts a new one (~50 ms). */
const IDLE_MS = 60_000;

/** What the caller of each task is told when the work is stopped. */
const STOPPED: Record<Task, (what: string) => AppError> = {
  importKey: (what) => invalid('invalid_key', `The key ${what}; it is refused.`),
  recipientKey: (what) => invalid('invalid_public_key', `The public key ${what}; it is refused.`),
  signerKey: (what) => invalid('invalid_public_key', `The public key ${what}; it is refused.`),
  detachedSignature: (what) => invalid('malformed_signature', `A signature ${what}; it is refused.`),
};

export class UntrustedPgp {
  private readonly pool: ThreadPool;

  constructor(
    private readonly opts: UntrustedOptions,
    private readonly metrics: Pick<Metrics, 'untrustedStopped'>,
  ) {
    this.pool = new ThreadPool({
      module: threadModule(import.meta.dirname, 'untrusted-thread'),
      threads: opts.threads,
      maxQueued: opts.maxQueued,
      deadlineMs: opts.deadlineMs,
      resourceLimits: { maxOldGenerationSizeMb: HEAP_MB },
      idleMs: IDLE_MS,
    });
  }

  run<K extends Task>(task: K, input: Parameters<Tasks[K]>[0]): Promise<Awaited<ReturnType<Tasks[K]>>> {
    const stopped: Stopped = (why) => {
      this.metrics.untrustedStopped.inc({ task, why });
      return STOPPED[task](
        why === 'deadline' ? `took longer than ${this.opts.deadlineMs / 1000} s to read and check` : 'needed too much memory to read and check',
      );
    };
    return this.pool.run(task, input, stopped) as Promise<Awaited<ReturnType<Tasks[K]>>>;
  }

  close(): Promise<void> {
    return this.pool.close();
  }
}
