import { defineProcessor } from '../define';
import { destructionSweep } from '../../jobs/destruction-sweep';
import { destroyDueGenerations } from '../../lib/lifecycle/key-lifecycle';

/**
 * Every few minutes (scheduler): destroys generations whose destruction wait is over. Safe
 * to run on several schedulers at once: each lineage is destroyed under its row lock, once.
 */
export const destructionSweepProcessor = defineProcessor(destructionSweep, {
  async process(_payload, { c, log }) {
    const out = await destroyDueGenerations(c);
    if (out.postponed) log.info(out, 'destruction postponed: jobs still need these keys');
    return out;
  },
});
