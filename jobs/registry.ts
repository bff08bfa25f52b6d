import type { z } from 'zod';
import type { JobDefinition } from './define';
import { sendEmail } from '../workers/jobs/send-email';
import { requestPasswordReset } from '../workers/jobs/request-password-reset';
import { purgeExpired } from '../workers/jobs/purge-expired';
import { purgeJobOutputs } from '../workers/jobs/purge-job-outputs';
import { sweepBlobs } from '../workers/jobs/sweep-blobs';
import { encryptFiles } from '../workers/jobs/encrypt-files';
import { decryptFiles } from '../workers/jobs/decrypt-files';
import { generateKeyJob } from '../workers/jobs/generate-key';
import { rotateKey } from '../workers/jobs/rotate-key';
import { rotateDueKey } from '../workers/jobs/rotate-due-key';
import { rotationSweep } from '../workers/jobs/rotation-sweep';
import { expirySweep } from '../workers/jobs/expiry-sweep';
import { deliverWebhook } from '../workers/jobs/deliver-webhook';
import { billingEvent, billingSweep } from '../workers/jobs/billing-event';
import { syncTeamAccess } from '../workers/jobs/sync-team-access';
import { destructionSweep } from '../workers/jobs/destruction-sweep';
import { rewrapFiles } from '../workers/jobs/rewrap-files';
import { reconcileJobs } from '../workers/jobs/reconcile-jobs';
import { resealKeyring } from '../workers/jobs/reseal-keyring';
import { auditCheckpoint } from '../workers/jobs/audit-checkpoint';
import { signFiles } from '../workers/jobs/sign-files';
import { verifyFiles } from '../workers/jobs/verify-files';

/**
 * The contract between producers (API, scheduler, other jobs) and consumers (workers): every job kind
 * with its queue, payload schema and processor. Enqueueing a name not listed here does not compile.
 */
export const jobs = {
  'send-email': sendEmail,
  'request-password-reset': requestPasswordReset,
  'purge-expired': purgeExpired,
  'purge-job-outputs': purgeJobOutputs,
  'sweep-blobs': sweepBlobs,
  'encrypt-files': encryptFiles,
  'decrypt-files': decryptFiles,
  'generate-key': generateKeyJob,
  'rotate-key': rotateKey,
  'rotate-due-key': rotateDueKey,
  'rotation-sweep': rotationSweep,
  'expiry-sweep': expirySweep,
  'deliver-webhook': deliverWebhook,
  'billing-event': billingEvent,
  'billing-sweep': billingSweep,
  'sync-team-access': syncTeamAccess,
  'destruction-sweep': destructionSweep,
  'rewrap-files': rewrapFiles,
  'reconcile-jobs': reconcileJobs,
  'reseal-keyring': resealKeyring,
  'audit-checkpoint': auditCheckpoint,
  'sign-files': signFiles,
  'verify-files': verifyFiles,
} as const;

export type JobName = keyof typeof jobs;
export type PayloadOf<N extends JobName> = z.input<(typeof jobs)[N]['schema']>;

for (const [name, def] of Object.entries(jobs) as [string, JobDefinition][]) {
  if (def.name !== name) throw new Error(`job registry: "${name}" is registered under the wrong name ("${def.name}")`);
}

export function jobDefinition(name: string): JobDefinition | undefined {
  return (jobs as Record<string, JobDefinition>)[name];
}
