import { z } from 'zod';
import { defineContract } from './define';

export const billingEvent = defineContract({
  queue: 'billing',
  name: 'billing-event',
  schema: z.object({ event_id: z.string().regex(/^[A-Za-z0-9_]{1,255}$/) }),
  options: { attempts: 10, backoff: { type: 'exponential', delay: 5000 }, removeOnComplete: true, removeOnFail: true },
});

export const billingSweep = defineContract({
  queue: 'billing',
  name: 'billing-sweep',
  schema: z.object({ older_than_seconds: z.number().int().min(0).max(86_400).default(300) }),
  options: { attempts: 1, removeOnComplete: true, removeOnFail: true },
});
