import { defineProcessor } from '../define';
import { requestPasswordReset, resetRequestAad } from '../../jobs/request-password-reset';
import { originMeta } from '../../jobs/define';
import { issuePasswordReset } from '../../lib/accounts/user-accounts';

/**
 * The work behind POST /auth/forgot-password, off the request path: the API seals the address and
 * enqueues this job whether or not an account has it, so both answers cost the same. Here an
 * existing account gets its token (stored hashed) and the email; an unknown address gets nothing.
 */
export const requestPasswordResetProcessor = defineProcessor(requestPasswordReset, {
  async process(payload, { c, origin }) {
    const email = c.sealer.openText(payload.sealed_email, resetRequestAad(payload.request_id));
    await issuePasswordReset(c, email, { ...originMeta(origin), ip: origin.ip ?? '', requestId: origin.request_id ?? '' });
    return {};
  },
});
