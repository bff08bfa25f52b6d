import { AppError } from '../lib/errors';

/**
 * Limits of one job attempt: a wall-clock deadline, and (for jobs that move bytes) a no-progress limit.
 * Either one aborts `signal` with a 422 AppError, which fails the job for good: hostile input (a parser
 * that never settles, a stream that stops) fails a job instead of holding a worker slot forever.
 * `race` makes any promise lose to the abort, so a library call that never settles cannot hold the job.
 */
/** Watchdogs of the jobs running in this process, so that shutdown can stop them. */
const running = new Set<Watchdog>();
/** The watchdog of a job's signal: a step handed only the signal still says what the job waits for. */
const bySignal = new WeakMap<AbortSignal, Watchdog>();

/** Aborts every running job of this process (shutdown past its grace period): they are retried elsewhere. */
export function abortRunningJobs(reason: Error): number {
  const n = running.size;
  for (const w of [...running]) w.abort(reason);
  return n;
}

export class Watchdog {
  private readonly controller = new AbortController();
  private readonly timers: NodeJS.Timeout[] = [];
  private last = Date.now();
  /** Waits that are not the job's own lack of progress (for a worker slot): the idle limit does not run meanwhile. */
  private excused = 0;
  /** Waits for the job's upload (its next file, its end): a lack of progress meanwhile is the upload's. */
  private awaitingUpload = 0;

  constructor(limits: { timeoutMs: number; idleMs?: number }) {
    const { timeoutMs, idleMs } = limits;
    this.timers.push(
      setTimeout(
        () => this.abort(new AppError(422, 'job_timeout', `The job ran past its limit of ${Math.round(timeoutMs / 1000)} s and was stopped.`)),
        timeoutMs,
      ),
    );
    if (idleMs) {
      const check = () => {
        if (this.excused === 0 && Date.now() - this.last >= idleMs) this.abort(this.stalled(Math.round(idleMs / 1000)));
      };
      this.timers.push(setInterval(check, Math.max(50, Math.min(1000, idleMs / 4))));
    }
    for (const t of this.timers) t.unref();
    running.add(this);
    bySignal.set(this.controller.signal, this);
  }

  /**
   * Why the job stopped without progress: while it waited for its upload, the upload never ended (the
   * client stopped sending, or its end could not be recorded while Postgres was out of reach), which
   * says nothing of the input; otherwise an input it could not get through.
   */
  private stalled(seconds: number): AppError {
    return this.awaitingUpload > 0
      ? new AppError(
          422,
          'upload_stalled',
          `The job's upload did not end for ${seconds} s (the client stopped sending, or its end could not be recorded); nothing was kept. Send it again.`,
        )
      : new AppError(422, 'job_stalled', `The job made no progress for ${seconds} s (an input that cannot be processed) and was stopped.`);
  }

  /** Settles with `wait`, a wait of the job (aborted by `signal`) for its upload's next file or end. */
  static async awaitingUpload<T>(signal: AbortSignal, wait: Promise<T>): Promise<T> {
    const w = bySignal.get(signal);
    if (w) w.awaitingUpload += 1;
    try {
      return await wait;
    } finally {
      if (w) w.awaitingUpload -= 1;
    }
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** Progress was made: bytes moved. */
  touch(): void {
    this.last = Date.now();
  }

  /** Settles with `wait` (raced against the limits) without it counting as a lack of progress. */
  async excuse<T>(wait: Promise<T>): Promise<T> {
    this.excused += 1;
    try {
      return await this.race(wait);
    } finally {
      this.excused -= 1;
      this.touch();
    }
  }

  abort(reason: Error): void {
    if (!this.controller.signal.aborted) this.controller.abort(reason);
    this.stop();
  }

  stop(): void {
    for (const t of this.timers) clearTimeout(t);
    running.delete(this);
  }

  /** Settles with `work`, or rejects with the abort reason as soon as the job is aborted. */
  race<T>(work: Promise<T>): Promise<T> {
    const signal = this.controller.signal;
    if (signal.aborted) return Promise.reject(signal.reason as Error);
    let onAbort!: () => void;
    const aborted = new Promise<never>((_, reject) => {
      onAbort = () => reject(signal.reason as Error);
      signal.addEventListener('abort', onAbort, { once: true });
    });
    work.catch(() => undefined); // a loser's later rejection is not unhandled
    return Promise.race([work, aborted]).finally(() => signal.removeEventListener('abort', onAbort));
  }
}
