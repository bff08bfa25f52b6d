import { z } from 'zod';
import { defineContract } from './define';

export const rotationSweep = defineContract({
  queue: 'rotation',
  name: 'rotation-sweep',
  schema: z.object({}),
  options: { attempts: 1, removeOnComplete: { count: 100 }, removeOnFail: { count: 100 } },
});
