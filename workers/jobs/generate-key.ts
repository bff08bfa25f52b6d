import { defineTrackedProcessor } from '../tracked';
import { generateKey, GenerateRequest, openGenerateLock } from '../../jobs/generate-key';
import { originMeta } from '../../jobs/define';
import { dropUnstoredTokenKey, keyGeneratedData, newGeneration, storeNewKey, type LineageSpec } from '../../lib/keys/key-catalog';
import { resyncLinkedTo } from '../../lib/teams/team-access';
import { keyOut } from '../../lib/keys/key-view';

/** Slow key types (RSA) are generated here rather than in the request. */
export const generateKeyProcessor = defineTrackedProcessor(generateKey, {
  async run(row, payload, _progress, { c, origin }) {
    const spec: LineageSpec = { ...GenerateRequest.parse(row.request).lineage, ...openGenerateLock(c.sealer, row.id, payload.sealed_lock) };
    const first = await newGeneration(c, { ...spec, user_id: row.user_id }, 1);
    return {
      async commit(trx) {
        const { lineage, key } = await storeNewKey(c, trx, row.user_id, spec, first, {
          job_id: row.id,
          ...originMeta(origin),
        });
        return { key: keyOut(lineage, key, c.clock.now()) };
      },
      events: () => [{ type: 'keys.generated', data: keyGeneratedData(spec, first) }],
      after: () => resyncLinkedTo(c, row.user_id, 'keys.generated', originMeta(origin)),
    };
  },
  // Failed for good: its lineage was never stored (a stored one completes the job in the same transaction).
  async onFailure(_trx, row, _failure, { c }) {
    const req = GenerateRequest.safeParse(row.request);
    if (req.success) await dropUnstoredTokenKey(c, req.data.lineage.id);
  },
});
