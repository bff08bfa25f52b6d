import { defineProcessor } from '../define';
import { rotateDueKey } from '../../jobs/rotate-due-key';
import { AppError } from '../../lib/errors';
import { recordRotationFailure, rotateLineage, type RotateInput } from '../../lib/lifecycle/rotation';

/**
 * A rotation the schedule or the account policy made due. Its job id names the lineage and the
 * generation being replaced, so one due window is enqueued once however many sweeps see it; and
 * rotateLineage leaves a lineage alone once it is past that generation.
 */
export const rotateDueKeyProcessor = defineProcessor(rotateDueKey, {
  async process(payload, { c, job, log, origin }) {
    // Enqueued by the scheduler's sweep: the origin is empty unless a request enqueued it.
    const input: RotateInput = { lineageId: payload.lineage_id, fromGeneration: payload.from_generation, trigger: payload.trigger, actorId: null, origin };
    try {
      const outcome = await rotateLineage(c, input);
      if (!outcome.rotated) log.info({ reason: outcome.reason }, 'due rotation skipped');
      return { rotated: outcome.rotated, new_fingerprint: outcome.entry?.new_fingerprint ?? null };
    } catch (err) {
      const final = (err instanceof AppError && err.status < 500) || job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
      if (final) {
        const failure =
          err instanceof AppError
            ? { code: err.code, message: err.message }
            : { code: 'rotation_failed', message: 'The scheduled rotation failed after retries.' };
        await recordRotationFailure(c, input, failure);
      }
      throw err;
    }
  },
});
