import { z } from 'zod';
import { defineJob } from '../../jobs/define';
import { checkpointChains } from '../../lib/services/audit-evidence';

/**
 * Every AUDIT_CHECKPOINT_INTERVAL_SECONDS (scheduler): signs the head of each audit chain that moved
 * since its last checkpoint and delivers it to the account (lib/services/audit-evidence.ts). A second
 * run, or a retry, finds the checkpoints stored and signs only what moved since.
 */
export const auditCheckpoint = defineJob({
  queue: 'maintenance',
  name: 'audit-checkpoint',
  schema: z.object({}),
  options: { attempts: 3, backoff: { type: 'exponential', delay: 10_000 }, removeOnComplete: { count: 100 }, removeOnFail: { count: 100 } },
  async process(_payload, { c, log }) {
    const { signed } = await checkpointChains(c);
    if (signed) log.info({ signed }, 'signed audit checkpoints');
    return { signed };
  },
});
