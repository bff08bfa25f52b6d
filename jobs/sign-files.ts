import { z } from 'zod';
import { failureAudit, trackedContract } from './tracked';

/** What the API stores in the job row for a signing (nothing secret). */
export const SignRequest = z.object({ lineage_id: z.uuid(), fingerprint: z.string(), detached: z.boolean(), armor: z.boolean() });
export type SignRequest = z.infer<typeof SignRequest>;

export const signFiles = trackedContract({
  queue: 'crypto',
  name: 'sign-files',
  extra: z.object({ sealed_passphrase: z.string() }),
  watchProgress: true,
  failureAudit: failureAudit('keys.sign', SignRequest, (r) => r.fingerprint),
});
