import { z } from 'zod';
import { defineContract } from './define';

export const rotateDueKey = defineContract({
  queue: 'rotation',
  name: 'rotate-due-key',
  schema: z.object({ lineage_id: z.uuid(), from_generation: z.number().int(), trigger: z.enum(['schedule', 'policy']) }),
  options: { attempts: 5, backoff: { type: 'exponential', delay: 5_000 }, removeOnComplete: { age: 86400, count: 10_000 }, removeOnFail: { age: 7 * 86400 } },
});

/** The job id of a due rotation: one per lineage and generation being replaced, however many sweeps see it due. */
export const dueJobId = (lineageId: string, generation: number) => `rotate-${lineageId}-g${generation}`;
