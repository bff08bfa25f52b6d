import { z } from 'zod';
import { defineContract } from './define';

/** AAD of a sealed forgot-password address: it opens for this one request only. */
export const resetRequestAad = (requestId: string) => `password-reset-request:${requestId}`;

export const requestPasswordReset = defineContract({
  queue: 'notify',
  name: 'request-password-reset',
  schema: z.object({ request_id: z.uuid(), sealed_email: z.string() }),
  options: { attempts: 3, backoff: { type: 'exponential', delay: 2_000 }, removeOnComplete: true, removeOnFail: true },
});
