import type { z } from 'zod';
import type { JobKind } from '../db/jobs';
import type { JobContract } from './define';
import { sendEmail } from './send-email';
import { requestPasswordReset } from './request-password-reset';
import { purgeExpired } from './purge-expired';
import { purgeJobOutputs } from './purge-job-outputs';
import { sweepBlobs } from './sweep-blobs';
import { encryptFiles } from './encrypt-files';
import { decryptFiles } from './decrypt-files';
import { generateKey } from './generate-key';
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
 * The contract between producers (API, services, scheduler, other jobs) and consumers (workers): every
 * job kind with its queue and payload schema. Enqueueing a name not listed here does not compile; the
 * work of each is in workers/processors.ts, which only workers load.
 */
export const contracts = {
  'send-email': sendEmail,
  'request-password-reset': requestPasswordReset,
  'purge-expired': purgeExpired,
  'purge-job-outputs': purgeJobOutputs,
  'sweep-blobs': sweepBlobs,
  'encrypt-files': encryptFiles,
  'decrypt-files': decryptFiles,
  'generate-key': generateKey,
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
} as const satisfies Record<string, JobContract>;

export type JobName = keyof typeof contracts;
export type PayloadOf<N extends JobName> = z.input<(typeof contracts)[N]['schema']>;

/** Each contract is listed under its own name. */
contracts satisfies { [N in JobName]: JobContract<N> };

/** The contract that runs each kind of job a client polls (jobs.kind). */
export const contractOfKind = {
  encrypt: encryptFiles,
  decrypt: decryptFiles,
  rewrap: rewrapFiles,
  'generate-key': generateKey,
  'rotate-key': rotateKey,
  sign: signFiles,
  verify: verifyFiles,
} as const satisfies Record<JobKind, JobContract>;

export function contractOf(name: string): JobContract | undefined {
  return Object.hasOwn(contracts, name) ? contracts[name as JobName] : undefined;
}
