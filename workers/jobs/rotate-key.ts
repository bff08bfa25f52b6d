import { defineTrackedProcessor } from '../tracked';
import type { JobOrigin } from '../../jobs/define';
import { RotateRequest, rotateKey, rotationPassphraseAad } from '../../jobs/rotate-key';
import {
  alreadyRotated,
  commitRotation,
  prepareRotation,
  recordRotationFailure,
  rotatedEvent,
  rotationOut,
  type CommittedRotation,
  type RotateInput,
  type RotateOutcome,
} from '../../lib/lifecycle/rotation';

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
    let committed: CommittedRotation | undefined;
    return {
      // The switch commits with the job's completed state: one transaction, and never one without the
      // other; its rows are written by the statement that completes the job.
      async commit(trx) {
        committed = await commitRotation(c, trx, input, prepared);
        return outcomeResult(committed ? { rotated: true, entry: committed.entry } : await alreadyRotated(trx, input));
      },
      writes: () => committed?.writes ?? [],
      events: () => (committed ? [rotatedEvent(prepared.lineage, committed.entry)] : []),
    };
  },
  async onFailure(trx, row, failure, { c, origin }) {
    await recordRotationFailure(c, inputOf(row, origin), failure, trx);
  },
});
