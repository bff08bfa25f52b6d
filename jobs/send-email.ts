import { z } from 'zod';
import { defineJob } from './define';
import { renderMail, MailTemplate } from '../lib/mail-templates';
import { mailAad } from '../lib/services/notify';

const Sealed = z.object({ to: z.email(), vars: z.record(z.string(), z.string()) });

/**
 * Sends one templated email. Recipient and variables travel sealed (see notify) and are opened only
 * here; the job leaves Redis as soon as it has ended, sent or given up.
 */
export const sendEmail = defineJob({
  queue: 'notify',
  name: 'send-email',
  schema: z.object({ mail_id: z.uuid(), template: MailTemplate, sealed: z.string() }),
  options: { attempts: 5, backoff: { type: 'exponential', delay: 2_000 }, removeOnComplete: true, removeOnFail: true },
  async process(payload, { c, log }) {
    const { to, vars } = Sealed.parse(JSON.parse(c.sealer.openText(payload.sealed, mailAad(payload.template, payload.mail_id))));
    const mail = renderMail(payload.template, vars, c.config);
    const { messageId } = await c.mailer.send({ to, ...mail });
    log.info({ template: payload.template, mail_id: payload.mail_id, messageId }, 'email sent');
    return { message_id: messageId };
  },
});
