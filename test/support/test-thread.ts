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

// A module that is slow to load (TEST_THREAD_LOAD_MS), as one with a large import graph is under tsx.
const loadMs = Number(process.env.TEST_THREAD_LOAD_MS ?? 0);
for (const end = Date.now() + loadMs; Date.now() < end;);

if (parentPort) serveTasks(parentPort, tasks);
