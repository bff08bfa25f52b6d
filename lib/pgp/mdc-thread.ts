import { Worker } from 'node:worker_threads';
import { threadModule } from '../thread-pool';
import { asError } from './thrown';

/**
 * The integrity check of a SEIPDv1 data stream (RFC 9580 §5.13.1) on a thread of its own, so that a
 * rewrap copies the encrypted data on one core while the other decrypts it (AES-CFB, zero IV, no resync)
 * (lib/pgp/cfb.ts) and hashes it (SHA-1) to check the MDC: the copy no longer waits for the check. No
 * plaintext leaves the thread; its answer is a verdict.
 *
 * The thread runs lib/pgp/mdc-check.ts (lib/thread-pool.ts threadModule).
 */
export type MdcVerdict = { ok: true } | { ok: false; kind: 'unsupported' | 'malformed' | 'tampered'; why: string };

/** The thread's module: beside the bundle's chunks (import.meta.dirname is dist/ there), or the source. */
const THREAD = threadModule(import.meta.dirname, 'mdc-check');

/** At most this much of the stream waits for the thread: the copy pauses beyond it (flat memory). */
const MAX_IN_FLIGHT = 16 << 20;

export class MdcThread {
  private readonly worker: Worker;
  private inFlight = 0;
  private resume: (() => void) | undefined;
  /** The thread has answered (a failure may come before the end) or died: nothing waits for it any more. */
  private settled = false;
  private readonly verdict: Promise<MdcVerdict>;

  /** `ecb`: the session key's AES in ECB mode, e.g. 'aes-256-ecb' (see lib/pgp/cfb.ts). */
  constructor(ecb: string, key: Uint8Array) {
    this.worker = new Worker(THREAD.file, { execArgv: THREAD.execArgv, workerData: { ecb, key } });
    this.verdict = new Promise<MdcVerdict>((resolve, reject) => {
      this.worker.on('message', (m: { done: number } | MdcVerdict) => {
        if ('done' in m) {
          this.inFlight -= m.done;
          if (this.inFlight <= MAX_IN_FLIGHT / 2) this.resume?.();
          return;
        }
        this.settle();
        resolve(m);
      });
      this.worker.once('error', (err: unknown) => (this.settle(), reject(asError(err))));
      this.worker.once('exit', (code) => (this.settle(), reject(new Error(`the MDC thread exited (${code})`))));
    });
    this.verdict.catch(() => undefined); // read by verify(); a thread that dies before is reported there
  }

  /** Hands a piece of the data packet's body to the thread (a copy: the caller keeps writing its own). */
  async update(piece: Buffer): Promise<void> {
    if (!piece.length) return;
    const copy = new Uint8Array(piece);
    this.inFlight += copy.length;
    this.worker.postMessage(copy, [copy.buffer]);
    if (this.inFlight > MAX_IN_FLIGHT && !this.settled) await new Promise<void>((resolve) => (this.resume = resolve));
    this.resume = undefined;
  }

  private settle(): void {
    this.settled = true;
    this.resume?.();
  }

  /** The verdict on everything handed over; the thread ends. */
  async verify(): Promise<MdcVerdict> {
    this.worker.postMessage(null);
    try {
      return await this.verdict;
    } finally {
      void this.worker.terminate();
    }
  }

  /** Stops the thread (the copy failed or was abandoned). */
  close(): void {
    void this.worker.terminate();
  }
}
