import { z } from 'zod';
import { failureAudit, trackedContract } from './tracked';
import type { Sealer } from '../lib/sealer';

/**
 * The lineage as the API prepared it, without its unlock key: the job row (kept in Postgres) holds
 * nothing derived from the passphrase, and nothing that decides where the first generation's secret is
 * sealed; both travel sealed in the BullMQ payload, gone when the job ends.
 */
export const GenerateRequest = z.object({
  lineage: z.object({
    id: z.uuid(),
    label: z.string(),
    environment: z.string(),
    uid_name: z.string(),
    uid_email: z.string(),
    algorithm: z.enum(['curve25519', 'rsa3072', 'rsa4096']),
    profile: z.literal('rfc4880').default('rfc4880'), // RSA keys, the only ones made as a job, are v4
    key_ttl_days: z.number().int().nullable(),
  }),
});

/** AAD of the lineage lock a generate-key job carries: it opens for this one job only. */
const generateLockAad = (jobId: string) => `generate-key-lock:${jobId}`;

const Lock = z.object({ unlock_public: z.string(), unlock_locked: z.string() });

/** The lineage's unlock key (public half, and the master-key sealed lock) as a generate-key payload carries it. */
export const sealGenerateLock = (sealer: Sealer, jobId: string, lock: z.infer<typeof Lock>) => sealer.seal(JSON.stringify(lock), generateLockAad(jobId));
export const openGenerateLock = (sealer: Sealer, jobId: string, sealed: string) => Lock.parse(JSON.parse(sealer.openText(sealed, generateLockAad(jobId))));

export const generateKey = trackedContract({
  queue: 'crypto',
  name: 'generate-key',
  extra: z.object({ sealed_lock: z.string() }),
  failureAudit: failureAudit('keys.generate'),
});
