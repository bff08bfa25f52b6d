import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { Watchdog, abortRunningJobs } from '../../workers/watchdog';
import { defineContract } from '../../jobs/define';
import { defineProcessor, type JobContext } from '../../workers/define';
import { AppError } from '../../lib/errors';

const never = () => new Promise<never>(() => undefined);
const code = (p: Promise<unknown>) =>
  p.then(
    () => 'settled',
    (err: unknown) => (err instanceof AppError ? err.code : String(err)),
  );

describe('Watchdog', () => {
  it('makes a promise that never settles lose to the wall-clock limit', async () => {
    const w = new Watchdog({ timeoutMs: 100 });
    expect(await code(w.race(never()))).toBe('job_timeout');
    expect(w.signal.aborted).toBe(true);
  });

  it('aborts when progress stops for idleMs, not while it is touched', async () => {
    const w = new Watchdog({ timeoutMs: 10_000, idleMs: 200 });
    const touching = setInterval(() => w.touch(), 50);
    await new Promise((r) => setTimeout(r, 500));
    expect(w.signal.aborted).toBe(false);
    clearInterval(touching);
    expect(await code(w.race(never()))).toBe('job_stalled');
  });

  it('blames the upload, not the input, for a stall while the job waits for its upload to end', async () => {
    const w = new Watchdog({ timeoutMs: 10_000, idleMs: 200 });
    const waiting = Watchdog.awaitingUpload(w.signal, never());
    expect(await code(w.race(waiting))).toBe('upload_stalled');
    expect((w.signal.reason as AppError).message).not.toMatch(/input/);
    // Once the wait has settled, a stall is the input's again.
    const after = new Watchdog({ timeoutMs: 10_000, idleMs: 200 });
    await Watchdog.awaitingUpload(after.signal, Promise.resolve());
    expect(await code(after.race(never()))).toBe('job_stalled');
  });

  it('lets work that settles in time through, and stops its timers', async () => {
    const w = new Watchdog({ timeoutMs: 1000, idleMs: 1000 });
    expect(await w.race(Promise.resolve(7))).toBe(7);
    w.stop();
    expect(abortRunningJobs(new Error('x'))).toBe(0);
  });

  it('can stop every running job of the process (shutdown past its grace period)', async () => {
    const w = new Watchdog({ timeoutMs: 10_000 });
    const raced = code(w.race(never()));
    expect(abortRunningJobs(new Error('the worker is shutting down'))).toBe(1);
    expect(await raced).toBe('Error: the worker is shutting down');
  });
});

describe('defineProcessor', () => {
  it('fails an attempt whose processor never settles', async () => {
    const job = defineProcessor(defineContract({ queue: 'maintenance', name: 'stuck', schema: z.object({}) }), { process: never });
    const ctx = { watchdog: new Watchdog({ timeoutMs: 100 }) } as unknown as JobContext;
    expect(await code(job.process({}, ctx))).toBe('job_timeout');
  });
});
