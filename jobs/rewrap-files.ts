import { z } from 'zod';
import { failureAudit, trackedContract } from './tracked';

/** What the API stores in the job row for a rewrap (nothing secret). */
export const RewrapRequest = z.object({ lineage_id: z.uuid(), fingerprint: z.string(), mode: z.enum(['rewrap', 'reencrypt']) });
export type RewrapRequest = z.infer<typeof RewrapRequest>;

export const rewrapFiles = trackedContract({
  queue: 'crypto',
  name: 'rewrap-files',
  extra: z.object({ sealed_passphrase: z.string() }),
  watchProgress: true,
  failureAudit: failureAudit('keys.rewrap', RewrapRequest, (r) => r.fingerprint),
});
