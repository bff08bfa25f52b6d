import { z } from 'zod';
import { defineContract } from './define';
import { MailTemplate } from '../lib/mail-templates';

/** AAD of a mail job's sealed message: it opens only as this template of this one job. */
export const mailAad = (template: MailTemplate, mailId: string) => `send-email:${template}:${mailId}`;

export const sendEmail = defineContract({
  queue: 'notify',
  name: 'send-email',
  schema: z.object({ mail_id: z.uuid(), template: MailTemplate, sealed: z.string() }),
  options: { attempts: 5, backoff: { type: 'exponential', delay: 2_000 }, removeOnComplete: true, removeOnFail: true },
});
