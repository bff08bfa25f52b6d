import type * as NodeCrypto from 'node:crypto';
import type * as WorkerThreads from 'node:worker_threads';
import { Worker } from 'node:worker_threads';
import { cfbDecryptor } from './cfb';

/**
 * The integrity check of a SEIPDv1 data stream (RFC 9580 §5.13.1) on a thread of its own, so that a
 * rewrap copies the encrypted data on one core while the other decrypts it (AES-CFB, zero IV, no resync)
 * (lib/pgp/cfb.ts) and hashes it (SHA-1) to check the MDC: the copy no longer waits for the check. No
 * plaintext leaves the thread; its answer is a verdict.
 *
 * The thread's code is `checkMdc` below, started from its source text (an eval worker), so that it runs
 * the same from the sources and from the bundle (dist/), which has no file of its own for it.
 */
export type MdcVerdict = { ok: true } | { ok: false; kind: 'unsupported' | 'malformed' | 'tampered'; why: string };

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
    // esbuild's keepNames (tsx, the bundle) wraps named functions in `__name(...)`: defined here as a no-op.
    // What the thread uses comes in as arguments (bundlers rename module bindings and `require` in code,
    // not in this text), the decryptor as source text too.
    const source = `(${checkMdc.toString()})(${cfbDecryptor.toString()}, require('node:worker_threads'), require('node:crypto'))`;
    this.worker = new Worker(`const __name = (fn) => fn;\n${source};`, { eval: true, workerData: { ecb, key } });
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
      this.worker.once('error', (err) => (this.settle(), reject(err)));
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

/**
 * The thread: pieces of the body as they come, `null` at the end. Self-contained (it runs from its
 * source text): no imports, no closures; its modules come as arguments.
 */
function checkMdc(decryptor: typeof cfbDecryptor, threads: typeof WorkerThreads, crypto: typeof NodeCrypto): void {
  const { parentPort, workerData } = threads;
  const { ecb, key } = workerData as { ecb: string; key: Uint8Array };
  const decipher = decryptor(crypto, ecb, key);
  const mdc = crypto.createHash('sha1');
  // The last 22 octets seen (the MDC packet: 2 header octets, hashed, and the 20-octet digest).
  const tail = Buffer.alloc(22);
  let tailLength = 0;
  let first = true;
  let failed = false;
  const fail = (kind: string, why: string) => {
    failed = true;
    parentPort!.postMessage({ ok: false, kind, why });
  };
  /** Hashes plaintext, all but the last 22 octets seen, which wait for the next piece or the end. */
  const consume = (d: Buffer) => {
    if (d.length >= 22) {
      if (tailLength) mdc.update(tail.subarray(0, tailLength));
      mdc.update(d.subarray(0, d.length - 22));
      d.copy(tail, 0, d.length - 22);
      tailLength = 22;
    } else if (d.length) {
      const all = Buffer.concat([tail.subarray(0, tailLength), d]);
      if (all.length > 22) mdc.update(all.subarray(0, all.length - 22));
      tailLength = all.copy(tail, 0, Math.max(0, all.length - 22));
    }
  };
  parentPort!.on('message', (piece: Uint8Array | null) => {
    if (failed) return;
    if (piece === null) {
      if (first) return fail('malformed', 'the encrypted data packet is empty');
      // The prefix (18 octets) and an MDC packet at least; the prefix's quick check is not consulted (§14.4).
      if (tailLength !== 22 || tail[0] !== 0xd3 || tail[1] !== 0x14) return fail('tampered', 'no MDC packet at the end');
      mdc.update(tail.subarray(0, 2));
      if (!crypto.timingSafeEqual(mdc.digest(), tail.subarray(2))) return fail('tampered', 'MDC mismatch');
      return parentPort!.postMessage({ ok: true });
    }
    let body = Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
    const size = body.length;
    if (first) {
      first = false;
      if (body[0] !== 1) return fail('unsupported', `a version ${body[0]} encrypted data packet`);
      body = body.subarray(1);
    }
    for (const d of decipher.update(body)) consume(d);
    parentPort!.postMessage({ done: size });
  });
}
