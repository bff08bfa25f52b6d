import type { z } from 'zod';
import type { JobDefinition } from './define';
import { sendEmail } from './send-email';
import { requestPasswordReset } from './request-password-reset';
import { purgeExpired } from './purge-expired';
import { purgeJobOutputs } from './purge-job-outputs';
import { sweepBlobs } from './sweep-blobs';
import { encryptFiles } from './encrypt-files';
import { decryptFiles } from './decrypt-files';
import { generateKeyJob } from './generate-key';
import { rotateKey } from './rotate-key';
import { rotateDueKey } from './rotate-due-key';
import { rotationSweep } from './rotation-sweep';
import { expirySweep } from './expiry-sweep';
import { deliverWebhook } from './deliver-webhook';
import { billingEvent, billingSweep } from './billing-event';
import { syncTeamAccess } from './sync-team-access';
import { destructionSweep } from './destruction-sweep';
import { rewrapFiles } from './rewrap-files';
import { reconcileJobs } from './reconcile-jobs';
import { resealKeyring } from './reseal-keyring';
import { auditCheckpoint } from './audit-checkpoint';
import { signFiles } from './sign-files';
import { verifyFiles } from './verify-files';

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
