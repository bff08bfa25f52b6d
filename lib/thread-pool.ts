import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { Worker, type MessagePort, type ResourceLimits } from 'node:worker_threads';
import { AppError } from './errors';

/**
 * A thread's module `name` in `dir`: built to its own file beside the bundle (scripts/build.mjs names it
 * an entry point), or the source through tsx, as the rest of the service runs from the sources.
 */
export const threadModule = (dir: string, name: string): { file: string; execArgv: string[] } =>
  existsSync(join(dir, `${name}.js`)) ? { file: join(dir, `${name}.js`), execArgv: [] } : { file: join(dir, `${name}.ts`), execArgv: ['--import', 'tsx'] };

/**
 * Threads that run work whose cost a caller controls (lib/pgp/untrusted.ts), so that the work, not only
 * the waiting, stops at its deadline: a thread past it is terminated and replaced, and the event loop
 * never runs a caller's cost. A thread runs one task at a time; tasks beyond the threads wait in a
 * bounded queue, and one that cannot start before its deadline is refused as the service being busy.
 * A thread that runs out of its heap (`resourceLimits`) is treated like one past its deadline.
 *
 * The thread's module answers `{ id, output }` or `{ id, error }` for each `{ id, task, input }` it gets
 * (see `serveTasks`). Idle threads end after `idleMs`, so the memory of a burst is given back.
 */
export interface ThreadPoolOptions {
  /** The thread's module and the arguments Node runs it with (`--import tsx` from the sources). */
  module: { file: string; execArgv: string[] };
  threads: number;
  /** Tasks waiting for a thread beyond the running ones; more are refused at once. */
  maxQueued: number;
  deadlineMs: number;
  resourceLimits?: ResourceLimits;
  idleMs?: number;
}

/** What the caller gets when its task is stopped: at its deadline, or out of memory. */
export type Stopped = (why: 'deadline' | 'memory') => AppError;

interface Pending {
  id: number;
  task: string;
  input: unknown;
  resolve: (output: unknown) => void;
  reject: (err: unknown) => void;
  stopped: Stopped;
  /** When it must have ended (counted from submission: waiting for a busy thread is part of it, a new thread's start-up is not). */
  deadline: number;
}

interface Slot {
  worker: Worker;
  /** Its module has loaded (it said so): tasks are posted, and their time counted, only from then on. */
  ready: boolean;
  /** The task given to it while it was starting. */
  first?: Pending;
  running?: { pending: Pending; timer: NodeJS.Timeout };
  /** The timer that ends it: idle too long, or (starting) not ready in STARTUP_LIMIT_MS. */
  idle?: NodeJS.Timeout;
}

/** A task's failure as it crosses the thread boundary: an AppError keeps its status, code and extras. */
type WireError = { app: { status: number; code: string; message: string; extra: AppError['extra'] } } | { message: string };

/** How long a new thread may take to load its module before its first task is given up. */
const STARTUP_LIMIT_MS = 30_000;

const busy = () =>
  new AppError(503, 'overloaded', 'The service is checking too many keys or signatures at once; retry after the delay in Retry-After.', {
    headers: { 'Retry-After': '1' },
  });

export class ThreadPool {
  private readonly slots = new Set<Slot>();
  private readonly queue: Pending[] = [];
  private nextId = 0;
  private closed = false;

  constructor(private readonly opts: ThreadPoolOptions) {}

  run(task: string, input: unknown, stopped: Stopped): Promise<unknown> {
    if (this.closed) return Promise.reject(new Error('the thread pool is closed'));
    const free = [...this.slots].find((s) => !s.running && !s.first);
    if (!free && this.slots.size >= this.opts.threads && this.queue.length >= this.opts.maxQueued) return Promise.reject(busy());
    return new Promise((resolve, reject) => {
      const pending: Pending = { id: ++this.nextId, task, input, resolve, reject, stopped, deadline: Date.now() + this.opts.deadlineMs };
      if (free) this.start(free, pending);
      else if (this.slots.size < this.opts.threads) this.start(this.spawn(), pending);
      else this.queue.push(pending);
    });
  }

  /** Ends every thread; running and waiting tasks are rejected. */
  async close(): Promise<void> {
    this.closed = true;
    for (const p of this.queue.splice(0)) p.reject(new Error('the thread pool is closed'));
    await Promise.all([...this.slots].map((s) => this.end(s, new Error('the thread pool is closed'))));
  }

  private spawn(): Slot {
    const worker = new Worker(this.opts.module.file, { execArgv: this.opts.module.execArgv, resourceLimits: this.opts.resourceLimits });
    worker.unref();
    const slot: Slot = { worker, ready: false };
    this.slots.add(slot);
    worker.on('message', (m: { id: number; output?: unknown; error?: WireError; ready?: true }) => {
      if (m.ready) {
        slot.ready = true;
        const first = slot.first;
        slot.first = undefined;
        if (first) this.start(slot, { ...first, deadline: Date.now() + this.opts.deadlineMs });
        else this.next(slot);
        return;
      }
      const running = slot.running;
      if (running?.pending.id !== m.id) return;
      clearTimeout(running.timer);
      slot.running = undefined;
      if (m.error) running.pending.reject(revive(m.error));
      else running.pending.resolve(m.output);
      this.next(slot);
    });
    const died = (err: unknown) => {
      if (!this.slots.delete(slot)) return;
      const running = slot.running ?? (slot.first && { pending: slot.first, timer: undefined });
      clearTimeout(slot.idle);
      if (running) {
        clearTimeout(running.timer);
        const memory = (err as { code?: string } | undefined)?.code === 'ERR_WORKER_OUT_OF_MEMORY';
        running.pending.reject(memory ? running.pending.stopped('memory') : err instanceof Error ? err : new Error('the untrusted-work thread exited'));
      }
      this.drain();
    };
    worker.once('error', died);
    worker.once('exit', (code) => died(new Error(`the untrusted-work thread exited (${code})`)));
    return slot;
  }

  private start(slot: Slot, pending: Pending): void {
    if (!slot.ready) {
      slot.first = pending;
      // A thread that never comes up must not hold its task forever.
      slot.idle = setTimeout(() => {
        if (slot.ready) return;
        slot.first = undefined;
        pending.reject(pending.stopped('deadline'));
        void this.end(slot);
      }, STARTUP_LIMIT_MS).unref();
      return;
    }
    clearTimeout(slot.idle);
    const left = pending.deadline - Date.now();
    const timer = setTimeout(
      () => {
        pending.reject(pending.stopped('deadline'));
        slot.running = undefined;
        void this.end(slot);
      },
      Math.max(0, left),
    );
    slot.running = { pending, timer };
    slot.worker.postMessage({ id: pending.id, task: pending.task, input: pending.input });
  }

  /** The slot is free: the next task that can still meet its deadline, else idle. */
  private next(slot: Slot): void {
    for (let p = this.queue.shift(); p; p = this.queue.shift()) {
      if (p.deadline > Date.now()) return this.start(slot, p);
      p.reject(busy());
    }
    if (this.opts.idleMs !== undefined) slot.idle = setTimeout(() => void this.end(slot), this.opts.idleMs).unref();
  }

  /** A thread went away: waiting tasks get a new one. */
  private drain(): void {
    if (this.closed || this.queue.length === 0 || this.slots.size >= this.opts.threads) return;
    this.next(this.spawn());
  }

  private async end(slot: Slot, err?: Error): Promise<void> {
    this.slots.delete(slot);
    clearTimeout(slot.idle);
    if (slot.running) {
      clearTimeout(slot.running.timer);
      slot.running.pending.reject(err ?? new Error('the untrusted-work thread ended'));
      slot.running = undefined;
    }
    slot.first?.reject(err ?? new Error('the untrusted-work thread ended'));
    slot.first = undefined;
    await slot.worker.terminate();
    this.drain();
  }
}

function revive(err: WireError): Error {
  if ('app' in err) return new AppError(err.app.status, err.app.code, err.app.message, err.app.extra);
  return new Error(err.message);
}

/** The thread's side: runs each task it is sent from `tasks` and answers its output or its error. */
export function serveTasks(port: MessagePort, tasks: Record<string, (input: never) => Promise<unknown>>): void {
  port.postMessage({ ready: true }); // the module and everything it imports have loaded
  port.on('message', ({ id, task, input }: { id: number; task: string; input: never }) => {
    const work = Object.hasOwn(tasks, task) ? tasks[task] : undefined;
    Promise.resolve()
      .then(() => {
        if (!work) throw new Error(`no task ${task}`);
        return work(input);
      })
      .then(
        (output) => port.postMessage({ id, output }),
        (err: unknown) =>
          port.postMessage({
            id,
            error:
              err instanceof AppError
                ? { app: { status: err.status, code: err.code, message: err.message, extra: err.extra } }
                : { message: err instanceof Error ? err.message : String(err) },
          }),
      );
  });
}
