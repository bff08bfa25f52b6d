import { z } from 'zod';
import { defineContract } from './define';

export const resealKeyring = defineContract({
  queue: 'maintenance',
  name: 'reseal-keyring',
  schema: z.object({ target_kid: z.string().regex(/^[A-Za-z0-9_-]{1,32}$/) }),
  options: { attempts: 20, backoff: { type: 'exponential', delay: 2000 }, removeOnComplete: { count: 100 }, removeOnFail: { count: 100 } },
});
