import { z } from 'zod';
import { failureAudit, trackedContract } from './tracked';
import { Signer } from './verify-files';

/** What the API stores in the job row for a decryption (nothing secret). */
export const DecryptRequest = z.object({
  lineage_id: z.uuid(),
  fingerprint: z.string(),
  /** Decrypt and verify: whose signatures are checked, and whether a file without a valid one fails. */
  verify_with: Signer.optional(),
  require_signature: z.boolean().optional(),
});

export const decryptFiles = trackedContract({
  queue: 'crypto',
  name: 'decrypt-files',
  extra: z.object({ sealed_passphrase: z.string() }),
  watchProgress: true,
  failureAudit: failureAudit('keys.decrypt', DecryptRequest, (r) => r.fingerprint),
});
