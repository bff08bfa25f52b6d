import { z } from 'zod';
import { failureAudit, trackedContract } from './tracked';
import type { SignatureCheck } from '../lib/pgp/verification';

/**
 * Whose signatures a job checks, as its row records it: a stored key (every generation of it: old
 * generations verify what they signed) or a public key sent with the request (kept with the job's files).
 */
export const Signer = z.discriminatedUnion('type', [
  z.object({ type: z.literal('stored'), lineage_id: z.uuid(), fingerprint: z.string() }),
  z.object({ type: z.literal('supplied'), fingerprint: z.string() }),
]);
export type Signer = z.infer<typeof Signer>;

/** What the API stores in the job row for a verification: the signer, and how many detached signatures came (0: signed messages). */
export const VerifyRequest = z.object({ signer: Signer, signatures: z.number().int().min(0) });

/** A file's verdict as the job result lists it. */
export type FileSignature = SignatureCheck & { n: number; name: string };

export const verifyFiles = trackedContract({
  queue: 'crypto',
  name: 'verify-files',
  watchProgress: true,
  failureAudit: failureAudit('keys.verify', VerifyRequest, (r) => r.signer.fingerprint),
});
