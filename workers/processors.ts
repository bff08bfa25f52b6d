import type { JobName, contracts } from '../jobs/contracts';
import type { Processor } from './define';
import { sendEmailProcessor } from './jobs/send-email';
import { requestPasswordResetProcessor } from './jobs/request-password-reset';
import { purgeExpiredProcessor } from './jobs/purge-expired';
import { purgeJobOutputsProcessor } from './jobs/purge-job-outputs';
import { sweepBlobsProcessor } from './jobs/sweep-blobs';
import { encryptFilesProcessor } from './jobs/encrypt-files';
import { decryptFilesProcessor } from './jobs/decrypt-files';
import { generateKeyProcessor } from './jobs/generate-key';
import { rotateKeyProcessor } from './jobs/rotate-key';
import { rotateDueKeyProcessor } from './jobs/rotate-due-key';
import { rotationSweepProcessor } from './jobs/rotation-sweep';
import { expirySweepProcessor } from './jobs/expiry-sweep';
import { deliverWebhookProcessor } from './jobs/deliver-webhook';
import { billingEventProcessor, billingSweepProcessor } from './jobs/billing-event';
import { syncTeamAccessProcessor } from './jobs/sync-team-access';
import { destructionSweepProcessor } from './jobs/destruction-sweep';
import { rewrapFilesProcessor } from './jobs/rewrap-files';
import { reconcileJobsProcessor } from './jobs/reconcile-jobs';
import { resealKeyringProcessor } from './jobs/reseal-keyring';
import { auditCheckpointProcessor } from './jobs/audit-checkpoint';
import { signFilesProcessor } from './jobs/sign-files';
import { verifyFilesProcessor } from './jobs/verify-files';

/**
 * The work behind every job contract (jobs/contracts.ts): exactly one processor per contract, each
 * made for that contract, or this does not compile.
 */
const processors: { [N in JobName]: Processor<(typeof contracts)[N]> } = {
  'send-email': sendEmailProcessor,
  'request-password-reset': requestPasswordResetProcessor,
  'purge-expired': purgeExpiredProcessor,
  'purge-job-outputs': purgeJobOutputsProcessor,
  'sweep-blobs': sweepBlobsProcessor,
  'encrypt-files': encryptFilesProcessor,
  'decrypt-files': decryptFilesProcessor,
  'generate-key': generateKeyProcessor,
  'rotate-key': rotateKeyProcessor,
  'rotate-due-key': rotateDueKeyProcessor,
  'rotation-sweep': rotationSweepProcessor,
  'expiry-sweep': expirySweepProcessor,
  'deliver-webhook': deliverWebhookProcessor,
  'billing-event': billingEventProcessor,
  'billing-sweep': billingSweepProcessor,
  'sync-team-access': syncTeamAccessProcessor,
  'destruction-sweep': destructionSweepProcessor,
  'rewrap-files': rewrapFilesProcessor,
  'reconcile-jobs': reconcileJobsProcessor,
  'reseal-keyring': resealKeyringProcessor,
  'audit-checkpoint': auditCheckpointProcessor,
  'sign-files': signFilesProcessor,
  'verify-files': verifyFilesProcessor,
};

export function processorOf(name: string): Processor | undefined {
  return Object.hasOwn(processors, name) ? processors[name as JobName] : undefined;
}
