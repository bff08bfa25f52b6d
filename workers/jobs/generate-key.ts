import { z } from 'zod';
import type { Container } from '../../lib/container';
import { defineTrackedJob } from '../tracked';
import { keyGeneratedData, newGeneration, storeNewKey, type LineageSpec } from '../../lib/services/keys';
import { resyncLinkedTo } from '../../lib/services/team-access';
import { recordAudit } from '../../db/audit';
import { keyOut } from '../../lib/services/key-view';

/** AAD of the lineage lock a generate-key job carries: it opens for this one job only. */
const generateLockAad = (jobId: string) => `generate-key-lock:${jobId}`;

const Lock = z.object({ unlock_public: z.string(), unlock_locked: z.string() });

/** The lineage's unlock key (public half, and the master-key sealed lock) as a generate-key payload carries it. */
export const sealGenerateLock = (c: Container, jobId: string, lock: z.infer<typeof Lock>) => c.sealer.seal(JSON.stringify(lock), generateLockAad(jobId));
const openGenerateLock = (c: Container, jobId: string, sealed: string) => Lock.parse(JSON.parse(c.sealer.openText(sealed, generateLockAad(jobId))));

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
    key_ttl_days: z.number().int().nullable(),
  }),
});

/** Slow key types (RSA) are generated here rather than in the request. */
export const generateKeyJob = defineTrackedJob({
  queue: 'crypto',
  name: 'generate-key',
  extra: z.object({ sealed_lock: z.string() }),
  async run(row, payload, _progress, { c, origin }) {
    const spec: LineageSpec = { ...GenerateRequest.parse(row.request).lineage, ...openGenerateLock(c, row.id, payload.sealed_lock) };
    const first = await newGeneration(c, { ...spec, user_id: row.user_id }, 1);
    return {
      async commit(trx) {
        const { lineage, key } = await storeNewKey(c, trx, row.user_id, spec, first, { job_id: row.id, ip: origin.ip ?? undefined, requestId: origin.request_id ?? undefined });
        return { key: keyOut(lineage, key, c.clock.now()) };
      },
      events: () => [{ type: 'key.generated', data: keyGeneratedData(spec, first) }],
      after: () => resyncLinkedTo(c, row.user_id, 'key.generated', { requestId: origin.request_id ?? undefined, ip: origin.ip ?? undefined }),
    };
  },
  async onFailure(trx, row, failure, { origin }) {
    await recordAudit(trx, { ...origin, user_id: row.user_id, action: 'keys.generate', status: 'failure', details: { job_id: row.id, code: failure.code } });
  },
});
