import { z } from 'zod';
import { defineJob } from './define';
import { renderMail, MailTemplate } from '../lib/mail-templates';

/**
 * Sends one templated email. Template variables may hold secrets (reset links), so they travel sealed
 * under the master key and are opened only here.
 */
export const sendEmail = defineJob({
  queue: 'notify',
  name: 'send-email',
  schema: z.object({
    to: z.email(),
    template: MailTemplate,
    sealed_vars: z.string(),
  }),
  options: { attempts: 5, backoff: { type: 'exponential', delay: 2_000 }, removeOnComplete: { age: 3600, count: 1000 }, removeOnFail: { age: 7 * 86400 } },
  async process(payload, { c, log }) {
    const vars = JSON.parse(c.sealer.openText(payload.sealed_vars, 'send-email')) as Record<string, string>;
    const mail = renderMail(payload.template, vars, c.config);
    const { messageId } = await c.mailer.send({ to: payload.to, ...mail });
    log.info({ template: payload.template, messageId }, 'email sent');
    return { message_id: messageId };
  },
});
