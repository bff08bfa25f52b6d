import { z } from 'zod';
import { defineJob } from '../../jobs/define';
import { destroyDueGenerations } from '../../lib/services/key-lifecycle';

/**
 * Every few minutes (scheduler): destroys generations whose destruction wait is over. Safe
 * to run on several schedulers at once: each lineage is destroyed under its row lock, once.
 */
export const destructionSweep = defineJob({
  queue: 'maintenance',
  name: 'destruction-sweep',
  schema: z.object({}),
  options: { attempts: 3, backoff: { type: 'exponential', delay: 10_000 }, removeOnComplete: { count: 100 }, removeOnFail: { count: 100 } },
  async process(_payload, { c, log }) {
    const out = await destroyDueGenerations(c);
    if (out.postponed) log.info(out, 'destruction postponed: jobs still need these keys');
    return out;
  },
});
