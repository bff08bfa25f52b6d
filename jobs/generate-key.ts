import { z } from 'zod';
import { defineTrackedJob } from './tracked';
import { newGeneration, storeNewKey, type LineageSpec } from '../lib/services/keys';
import { recordAudit } from '../db/audit';
import { keyOut } from '../lib/services/key-view';

/** AAD of the lineage lock a generate-key job carries: it opens for this one job only. */
export const generateLockAad = (jobId: string) => `generate-key-lock:${jobId}`;

/**
 * The lineage as the API prepared it, without its lock: the job row (kept in Postgres) holds nothing
 * derived from the passphrase; the lock travels sealed in the BullMQ payload, gone when the job ends.
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
    unlock_public: z.string(),
  }),
});

/** Slow key types (RSA) are generated here rather than in the request. */
export const generateKeyJob = defineTrackedJob({
  queue: 'crypto',
  name: 'generate-key',
  extra: z.object({ sealed_lock: z.string() }),
  async run(row, payload, _progress, { c, origin }) {
    const spec: LineageSpec = { ...GenerateRequest.parse(row.request).lineage, unlock_locked: c.sealer.openText(payload.sealed_lock, generateLockAad(row.id)) };
    const first = await newGeneration(c, { ...spec, user_id: row.user_id }, 1);
    return {
      async commit(trx) {
        const { lineage, key } = await storeNewKey(c, trx, row.user_id, spec, first, { job_id: row.id, ip: origin.ip ?? undefined, requestId: origin.request_id ?? undefined });
        return { key: keyOut(lineage, key, c.clock.now()) };
      },
    };
  },
  async onFailure(trx, row, failure, { origin }) {
    await recordAudit(trx, { ...origin, user_id: row.user_id, action: 'keys.generate', status: 'failure', details: { job_id: row.id, code: failure.code } });
  },
});
