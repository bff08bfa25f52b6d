import { z } from 'zod';
import { defineContract } from './define';

export const reconcileJobs = defineContract({
  queue: 'maintenance',
  name: 'reconcile-jobs',
  schema: z.object({}),
  options: { attempts: 3, backoff: { type: 'exponential', delay: 10_000 }, removeOnComplete: { count: 100 }, removeOnFail: { count: 100 } },
});
