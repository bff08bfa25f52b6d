import { z } from 'zod';
import { defineJob } from '../../jobs/define';
import { issuePasswordReset, resetRequestAad } from '../../lib/services/accounts';

/**
 * The work behind POST /auth/forgot-password, off the request path: the API seals the address and
 * enqueues this job whether or not an account has it, so both answers cost the same. Here an
 * existing account gets its token (stored hashed) and the email; an unknown address gets nothing.
 */
export const requestPasswordReset = defineJob({
  queue: 'notify',
  name: 'request-password-reset',
  schema: z.object({ request_id: z.uuid(), sealed_email: z.string() }),
  options: { attempts: 3, backoff: { type: 'exponential', delay: 2_000 }, removeOnComplete: true, removeOnFail: true },
  async process(payload, { c, origin }) {
    const email = c.sealer.openText(payload.sealed_email, resetRequestAad(payload.request_id));
    await issuePasswordReset(c, email, { ip: origin.ip ?? '', requestId: origin.request_id ?? '' });
    return {};
  },
});
