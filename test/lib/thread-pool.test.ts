import { afterEach, describe, expect, it } from 'vitest';
import { join } from 'node:path';
import { AppError, invalid } from '../../lib/errors';
import { ThreadPool, threadModule, type Stopped } from '../../lib/thread-pool';

const module = threadModule(join(import.meta.dirname, '..', 'support'), 'test-thread');
const stopped: Stopped = (why) => invalid('stopped', `stopped: ${why}`);
let pool: ThreadPool | undefined;
const poolOf = (opts: Partial<ConstructorParameters<typeof ThreadPool>[0]> = {}) =>
  (pool = new ThreadPool({ module, threads: 1, maxQueued: 4, deadlineMs: 5000, resourceLimits: { maxOldGenerationSizeMb: 32 }, ...opts }));
afterEach(() => pool?.close());

const failure = (work: Promise<unknown>) =>
  work.then(
    () => {
      throw new Error('expected a failure');
    },
    (err: unknown) => err,
  );

describe('ThreadPool', () => {
  it('answers a task, and an AppError thrown on the thread keeps its status, code and field errors', async () => {
    const p = poolOf();
    expect(await p.run('echo', 'hello', stopped)).toBe('hello');
    const err = await failure(p.run('refuse', undefined, stopped));
    expect(err).toBeInstanceOf(AppError);
    expect(err).toMatchObject({ status: 422, code: 'refused_here', extra: { errors: [{ path: 'x', message: 'bad' }] } });
  });

  it('stops a task that spins past its deadline, and the next task runs on a new thread', async () => {
    const p = poolOf({ deadlineMs: 300 });
    const start = performance.now();
    expect(await failure(p.run('spin', undefined, stopped))).toMatchObject({ code: 'stopped', message: 'stopped: deadline' });
    expect(performance.now() - start).toBeLessThan(2000);
    expect(await p.run('echo', 'after', stopped)).toBe('after');
  });

  it('stops a task that outgrows its heap', async () => {
    const p = poolOf({ deadlineMs: 20_000 });
    expect(await failure(p.run('hog', undefined, stopped))).toMatchObject({ code: 'stopped', message: 'stopped: memory' });
    expect(await p.run('echo', 'after', stopped)).toBe('after');
  });

  it('refuses a task beyond the queue with 503 overloaded, and one that waited past its deadline', async () => {
    const p = poolOf({ maxQueued: 1, deadlineMs: 400 });
    const spinning = failure(p.run('spin', undefined, stopped));
    const waiting = failure(p.run('echo', 'waits', stopped));
    expect(await failure(p.run('echo', 'one too many', stopped))).toMatchObject({ status: 503, code: 'overloaded' });
    expect(await spinning).toMatchObject({ code: 'stopped' });
    expect(await waiting).toMatchObject({ status: 503, code: 'overloaded' });
  });

  it("does not count a new thread's start-up against its first task's deadline", async () => {
    process.env.TEST_THREAD_LOAD_MS = '700';
    try {
      const p = poolOf({ deadlineMs: 300 });
      expect(await p.run('echo', 'after a slow start', stopped)).toBe('after a slow start');
      expect(await failure(p.run('spin', undefined, stopped))).toMatchObject({ message: 'stopped: deadline' });
    } finally {
      delete process.env.TEST_THREAD_LOAD_MS;
    }
  });
});
