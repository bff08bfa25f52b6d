import { z } from 'zod';
import { failureAudit, trackedContract } from './tracked';

/** What the API stores in the job row for an encryption (nothing secret). */
export const EncryptRequest = z.object({
  recipient: z.discriminatedUnion('type', [
    z.object({ type: z.literal('stored'), key_id: z.uuid(), fingerprint: z.string(), requested_fingerprint: z.string() }),
    z.object({ type: z.literal('supplied'), fingerprint: z.string() }),
  ]),
  armor: z.boolean(),
  compress: z.boolean(),
  /** Sign and encrypt: the key whose current generation signs (its passphrase travels sealed in the payload). */
  sign_with: z.object({ lineage_id: z.uuid(), fingerprint: z.string() }).optional(),
});
export type EncryptRequest = z.infer<typeof EncryptRequest>;

/** The name and type of the output of input `name`: known from the request, so also while it is produced. */
export const encryptedOutput = (name: string, armor: boolean) => ({
  name: `${name}${armor ? '.asc' : '.gpg'}`,
  contentType: armor ? 'application/pgp-encrypted; charset=us-ascii' : 'application/pgp-encrypted',
});

/** Its sealed passphrase (passphraseAad) is there to sign only; a job enqueued again from its row has none. */
export const encryptFiles = trackedContract({
  queue: 'crypto',
  name: 'encrypt-files',
  extra: z.object({ sealed_passphrase: z.string().optional() }),
  watchProgress: true,
  failureAudit: failureAudit('keys.encrypt', EncryptRequest, (r) => r.recipient.fingerprint),
});
