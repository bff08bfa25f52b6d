import type { Readable } from 'node:stream';
import { invalid } from '../errors';

/** Default for `idleMs`: OpenPGP.js has moved no bytes for this long while we wait on it. */
const DEFAULT_IDLE_MS = 30_000;

export interface WatchOptions {
  /** Fails the work when OpenPGP.js moves no bytes for this long while we wait on it. */
  idleMs?: number;
  /** Fails the work with `signal.reason` (the caller's deadline or cancellation). */
  signal?: AbortSignal;
}

/**
 * Guards stream work done by OpenPGP.js, which on some hostile input never settles (no error, no
 * data, no CPU). Every call and every output read is raced against the caller's signal and an idle
 * timeout; on failure the input is destroyed and everything waiting is failed with the same error.
 *
 * The idle clock only runs while we wait on OpenPGP.js (`call`, `busy`) and not while OpenPGP.js waits
 * on our input (`pulling`): a slow store is not a malformed message (the caller's signal covers it), and
 * a consumer that stops reading (backpressure) is not waited on.
 */
export class Watch {
  failure: Error | undefined;
  private readonly idleMs: number;
  private readonly listeners = new Set<(err: Error) => void>();
  private waits = 0;
  private pulls = 0;
  private last = Date.now();
  private timer: NodeJS.Timeout | undefined;
  private readonly onAbort = () => this.fail(this.signal!.reason instanceof Error ? this.signal!.reason : new Error(String(this.signal!.reason)));
  private readonly signal: AbortSignal | undefined;

  constructor(
    private readonly input: Readable,
    opts: WatchOptions,
  ) {
    this.idleMs = opts.idleMs ?? DEFAULT_IDLE_MS;
    if (!(this.idleMs > 0)) throw new Error('idleMs must be positive');
    this.signal = opts.signal;
    if (this.signal?.aborted) this.onAbort();
    else this.signal?.addEventListener('abort', this.onAbort, { once: true });
  }

  /** Throws the failure, if any (before starting more work). */
  check(): void {
    if (this.failure) throw this.failure;
  }

  /** Bytes moved: the idle clock restarts. */
  moved(): void {
    this.last = Date.now();
  }

  /** Wraps a wait on our input (OpenPGP.js pulling); the idle clock stands still meanwhile. */
  async pulling<T>(work: Promise<T>): Promise<T> {
    this.pulls++;
    try {
      return await work;
    } finally {
      this.pulls--;
      this.moved();
    }
  }

  /** `work` unless the watch fails first (then its failure). */
  call<T>(work: Promise<T>): Promise<T> {
    work.catch(() => undefined); // a loser's rejection is not unhandled
    if (this.failure) return Promise.reject(this.failure);
    const done = this.busy();
    return new Promise<T>((resolve, reject) => {
      this.listeners.add(reject);
      work.then(resolve, reject).finally(() => {
        this.listeners.delete(reject);
        done();
      });
    });
  }

  /** Marks a wait on OpenPGP.js (an output read); call the result when it ends. */
  busy(): () => void {
    if (this.waits++ === 0) this.moved(); // time spent not asking does not count
    this.arm();
    let ended = false;
    return () => {
      if (!ended) this.waits--;
      ended = true;
    };
  }

  /** Runs `onFail` with the failure when (or if already) the watch fails. */
  onFail(onFail: (err: Error) => void): void {
    if (this.failure) onFail(this.failure);
    else this.listeners.add(onFail);
  }

  fail(err: Error): void {
    if (this.failure) return;
    this.failure = err;
    this.close();
    this.input.destroy();
    for (const listener of [...this.listeners]) listener(err);
    this.listeners.clear();
  }

  /** The work is over: no more timers or signal listener. */
  close(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.signal?.removeEventListener('abort', this.onAbort);
  }

  private arm(): void {
    if (this.timer || this.failure) return;
    this.timer = setTimeout(() => this.tick(), Math.max(1, this.last + this.idleMs - Date.now()));
  }

  private tick(): void {
    this.timer = undefined;
    if (this.failure || this.waits === 0) return;
    if (this.pulls > 0) this.moved();
    else if (Date.now() - this.last >= this.idleMs) {
      return this.fail(invalid('malformed_message', `The message is malformed: OpenPGP.js made no progress on it for ${this.idleMs} ms.`));
    }
    this.arm();
  }
}
