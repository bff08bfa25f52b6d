import { defineProcessor } from '../define';
import { auditCheckpoint } from '../../jobs/audit-checkpoint';
import { checkpointChains } from '../../lib/audit/audit-evidence';

/**
 * Every AUDIT_CHECKPOINT_INTERVAL_SECONDS (scheduler): signs the head of each audit chain that moved
 * since its last checkpoint and delivers it to the account (lib/audit/audit-evidence.ts). A second
 * run, or a retry, finds the checkpoints stored and signs only what moved since.
 */
export const auditCheckpointProcessor = defineProcessor(auditCheckpoint, {
  async process(_payload, { c, log }) {
    const { signed } = await checkpointChains(c);
    if (signed) log.info({ signed }, 'signed audit checkpoints');
    return { signed };
  },
});
