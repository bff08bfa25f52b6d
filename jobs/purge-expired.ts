import { z } from 'zod';
import { defineContract } from './define';

export const purgeExpired = defineContract({
  queue: 'maintenance',
  name: 'purge-expired',
  schema: z.object({}),
  options: { attempts: 3, backoff: { type: 'exponential', delay: 10_000 }, removeOnComplete: { count: 100 }, removeOnFail: { count: 100 } },
});
