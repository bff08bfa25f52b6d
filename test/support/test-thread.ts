import { parentPort } from 'node:worker_threads';
import { invalid } from '../../lib/errors';
import { serveTasks } from '../../lib/thread-pool';

/** A thread module for test/lib/thread-pool.test.ts: tasks that answer, fail, spin and eat memory. */
const tasks = {
  echo: async (input: string) => input,
  refuse: async () => {
    throw invalid('refused_here', 'Refused on the thread.', [{ path: 'x', message: 'bad' }]);
  },
  spin: async () => {
    for (;;);
  },
  hog: async () => {
    const held: number[][] = [];
    for (;;) held.push(new Array<number>(1 << 20).fill(held.length));
  },
};

if (parentPort) serveTasks(parentPort, tasks);
