import { defineProcessor } from '../define';
import { rotationSweep } from '../../jobs/rotation-sweep';
import { dueRotations } from '../../db/rotation';
import { dueJobId } from '../../jobs/rotate-due-key';

/** Every ROTATION_SWEEP_SECONDS (scheduler): enqueue every due rotation, under a deterministic job id. */
export const rotationSweepProcessor = defineProcessor(rotationSweep, {
  async process(_payload, { c, log }) {
    const due = await dueRotations(c.db, c.clock.now(), 1000);
    for (const d of due) {
      await c.jobs.enqueue(
        'rotate-due-key',
        { lineage_id: d.lineage_id, from_generation: d.generation, trigger: d.trigger },
        { jobId: dueJobId(d.lineage_id, d.generation) },
      );
    }
    if (due.length) log.info({ due: due.length }, 'rotations enqueued');
    return { enqueued: due.length };
  },
});
