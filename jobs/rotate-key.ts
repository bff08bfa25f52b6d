import { z } from 'zod';
import { defineTrackedJob } from './tracked';
import type { JobOrigin } from './define';
import { recordRotationFailure, rotateLineage, rotationOut, type RotateInput } from '../lib/services/rotation';

export const RotateRequest = z.object({ lineage_id: z.uuid(), from_generation: z.number().int(), fingerprint: z.string(), actor_id: z.uuid() });

/** AAD of the sealed passphrases of one rotation job. */
export const rotationPassphraseAad = (jobId: string) => `rotate-passphrases:${jobId}`;

const inputOf = (row: { id: string; request: unknown }, origin: JobOrigin): RotateInput => {
  const req = RotateRequest.parse(row.request);
  return { lineageId: req.lineage_id, fromGeneration: req.from_generation, trigger: 'manual', actorId: req.actor_id, jobId: row.id, origin };
};

/** "Rotate now", requested through the API and polled by the client. */
export const rotateKey = defineTrackedJob({
  queue: 'rotation',
  name: 'rotate-key',
  attempts: 5,
  extra: z.object({ sealed_passphrases: z.string().optional() }),
  async run(row, payload, _progress, { c, origin }) {
    const input = inputOf(row, origin);
    if (payload.sealed_passphrases) {
      input.passphrases = JSON.parse(c.sealer.openText(payload.sealed_passphrases, rotationPassphraseAad(row.id))) as RotateInput['passphrases'];
    }
    const outcome = await rotateLineage(c, input);
    // A retry after a crash finds the rotation done and reports it.
    return { result: { ...(outcome.entry ? rotationOut(outcome.entry) : {}), rotated: outcome.rotated, ...(outcome.rotated ? {} : { reason: outcome.reason }) } };
  },
  async onFailure(trx, row, failure, { c, origin }) {
    await recordRotationFailure(c, inputOf(row, origin), failure, trx);
  },
});
