import { z } from 'zod';
import { defineTrackedJob } from './tracked';
import { newGeneration, storeNewKey, type LineageSpec } from '../lib/services/keys';
import { recordAudit } from '../db/audit';
import { keyOut } from '../lib/services/key-view';

/** The lineage as the API prepared it (lock already derived from the passphrase, sealed). */
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
    unlock_locked: z.string(),
  }),
});

/** Slow key types (RSA) are generated here rather than in the request. */
export const generateKeyJob = defineTrackedJob({
  queue: 'crypto',
  name: 'generate-key',
  async run(row, _payload, _progress, { c }) {
    const spec: LineageSpec = GenerateRequest.parse(row.request).lineage;
    const first = await newGeneration(c, { ...spec, user_id: row.user_id }, 1);
    return {
      async commit(trx) {
        const { lineage, key } = await storeNewKey(trx, row.user_id, spec, first, { job_id: row.id });
        return { key: keyOut(lineage, key, c.clock.now()) };
      },
    };
  },
  async onFailure(trx, row, failure) {
    await recordAudit(trx, { user_id: row.user_id, action: 'keys.generate', status: 'failure', details: { job_id: row.id, code: failure.code } });
  },
});
