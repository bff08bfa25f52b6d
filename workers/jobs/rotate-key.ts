import { defineTrackedProcessor } from '../tracked';
import type { JobOrigin } from '../../jobs/define';
import { RotateRequest, rotateKey, rotationPassphraseAad } from '../../jobs/rotate-key';
import {
  alreadyRotated,
  commitRotation,
  prepareRotation,
  recordRotationFailure,
  resyncAfterRotation,
  rotatedEvent,
  rotationOut,
  type RotateInput,
  type RotateOutcome,
} from '../../lib/lifecycle/rotation';
import type { RotationRow } from '../../db/rotation';

const inputOf = (row: { id: string; request: unknown }, origin: JobOrigin): RotateInput => {
  const req = RotateRequest.parse(row.request);
  return {
    lineageId: req.lineage_id,
    fromGeneration: req.from_generation,
    trigger: 'manual',
    actorId: req.actor_id,
    jobId: row.id,
    origin,
    profile: req.profile,
  };
};

const outcomeResult = (outcome: RotateOutcome) => ({
  ...(outcome.entry ? rotationOut(outcome.entry) : {}),
  rotated: outcome.rotated,
  ...(outcome.rotated ? {} : { reason: outcome.reason }),
});

/** "Rotate now", requested through the API and polled by the client. */
export const rotateKeyProcessor = defineTrackedProcessor(rotateKey, {
  async run(row, payload, _progress, { c, origin }) {
    const input = inputOf(row, origin);
    if (payload.sealed_passphrases) {
      input.passphrases = JSON.parse(c.sealer.openText(payload.sealed_passphrases, rotationPassphraseAad(row.id))) as RotateInput['passphrases'];
    }
    const prepared = await prepareRotation(c, input);
    // A retry after a crash finds the rotation done and reports it.
    if (!('next' in prepared)) return { result: outcomeResult(prepared) };
    let entry: RotationRow | undefined;
    return {
      // The switch commits with the job's completed state: one transaction, and never one without the other.
      async commit(trx) {
        entry = await commitRotation(c, trx, input, prepared);
        return outcomeResult(entry ? { rotated: true, entry } : await alreadyRotated(trx, input));
      },
      events: () => (entry ? [rotatedEvent(prepared.lineage, entry)] : []),
      after: async () => {
        if (entry) await resyncAfterRotation(c, input, prepared.lineage);
      },
    };
  },
  async onFailure(trx, row, failure, { c, origin }) {
    await recordRotationFailure(c, inputOf(row, origin), failure, trx);
  },
});
