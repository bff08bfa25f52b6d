import { describe, expect, it } from 'vitest';
import { SlotPool } from '../../lib/slots';
import { Watchdog } from '../../workers/watchdog';

describe('SlotPool', () => {
  it('hands out at most its size, first come first served, and a slot given back goes to the next in line', async () => {
    const pool = new SlotPool(1);
    const [a, b, c] = [pool.slot(), pool.slot(), pool.slot()];
    await a.acquire();
    const order: string[] = [];
    const bDone = b.acquire().then(() => order.push('b'));
    const cDone = c.acquire().then(() => order.push('c'));
    await new Promise((r) => setTimeout(r, 10));
    expect(order).toEqual([]);
    a.release();
    await bDone;
    expect([order, pool.busy]).toEqual([['b'], 1]);
    b.release();
    await cDone;
    expect(order).toEqual(['b', 'c']);
    c.release();
    expect(pool.busy).toBe(0);
  });

  it('acquiring a held slot and releasing a free one change nothing', async () => {
    const pool = new SlotPool(2);
    const a = pool.slot();
    await a.acquire();
    await a.acquire();
    expect(pool.busy).toBe(1);
    a.release();
    a.release();
    expect(pool.busy).toBe(0);
  });

  it('a wait that is aborted leaves the line without taking a slot', async () => {
    const pool = new SlotPool(1);
    const a = pool.slot();
    await a.acquire();
    const stop = new AbortController();
    const waiting = pool.slot().acquire(stop.signal);
    stop.abort(new Error('job stopped'));
    await expect(waiting).rejects.toThrow('job stopped');
    a.release();
    expect(pool.busy).toBe(0);
  });

  it("a job's wait for a slot does not count against its no-progress limit", async () => {
    const pool = new SlotPool(1);
    const a = pool.slot();
    await a.acquire();
    const watchdog = new Watchdog({ timeoutMs: 10_000, idleMs: 100 });
    setTimeout(() => a.release(), 400);
    await watchdog.excuse(pool.slot().acquire(watchdog.signal));
    expect(watchdog.signal.aborted).toBe(false);
    watchdog.stop();
  });
});
