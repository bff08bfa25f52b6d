import { z } from 'zod';
import { trackedContract } from './tracked';
import { KEY_PROFILES } from '../lib/pgp/profiles';

/** What the API stores in the job row for a "rotate now" (nothing secret). */
export const RotateRequest = z.object({
  lineage_id: z.uuid(),
  from_generation: z.number().int(),
  fingerprint: z.string(),
  actor_id: z.uuid(),
  profile: z.enum(KEY_PROFILES).optional(),
});

/** AAD of the sealed passphrases of one rotation job. */
export const rotationPassphraseAad = (jobId: string) => `rotate-passphrases:${jobId}`;

export const rotateKey = trackedContract({
  queue: 'rotation',
  name: 'rotate-key',
  attempts: 5,
  extra: z.object({ sealed_passphrases: z.string().optional() }),
});
