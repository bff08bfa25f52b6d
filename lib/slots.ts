/**
 * A bounded pool of work slots, handed out first come, first served. A worker's crypto queue has one:
 * a job holds a slot while it transforms bytes and gives it back while it waits for the rest of its
 * upload, so how fast a client sends does not decide how much of the pool its job holds.
 */
export class SlotPool {
  private free: number;
  private readonly waiting: (() => void)[] = [];

  constructor(readonly size: number) {
    if (!Number.isInteger(size) || size < 1) throw new RangeError(`a slot pool needs at least one slot, not ${size}`);
    this.free = size;
  }

  /** Slots in use. */
  get busy(): number {
    return this.size - this.free;
  }

  /** A job's hold on the pool: none until `acquire`d. */
  slot(): Slot {
    let held = false;
    return {
      get held() {
        return held;
      },
      acquire: async (signal) => {
        if (held) return;
        await this.take(signal);
        held = true;
      },
      release: () => {
        if (!held) return;
        held = false;
        this.give();
      },
    };
  }

  private take(signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    if (this.free > 0 && this.waiting.length === 0) {
      this.free -= 1;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const grant = () => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = () => {
        const i = this.waiting.indexOf(grant);
        if (i >= 0) this.waiting.splice(i, 1);
        reject(signal!.reason as Error);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(grant);
    });
  }

  private give(): void {
    const next = this.waiting.shift();
    // A slot given back goes straight to the next in line: it is never free while someone waits.
    if (next) next();
    else this.free += 1;
  }
}

/** One job's hold on a pool. Both calls are idempotent: acquiring a held slot and releasing a free one do nothing. */
export interface Slot {
  readonly held: boolean;
  /** Waits for a slot (first come, first served); rejects with the signal's reason when it aborts first. */
  acquire(signal?: AbortSignal): Promise<void>;
  release(): void;
}

/** For work outside any pool: always held. */
export const NO_POOL: Slot = { held: true, acquire: async () => undefined, release: () => undefined };
