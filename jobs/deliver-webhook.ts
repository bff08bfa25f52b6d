import { z } from 'zod';
import { defineContract } from './define';

export const deliverWebhook = defineContract({
  queue: 'notify',
  name: 'deliver-webhook',
  schema: z.object({ delivery_id: z.uuid() }),
  // The schedule decides when to stop (its processor's retryDelayMs answers -1); attempts is only an upper bound.
  options: { attempts: 100, backoff: { type: 'webhook-schedule' }, removeOnComplete: true, removeOnFail: true },
});
