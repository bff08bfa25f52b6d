import { UnrecoverableError } from 'bullmq';
import { z } from 'zod';
import { defineProcessor } from '../define';
import { mailAad, sendEmail } from '../../jobs/send-email';
import { renderMail } from '../../lib/mail-templates';

const Sealed = z.object({ to: z.email(), vars: z.record(z.string(), z.string()) });

/**
 * Sends one templated email. Recipient and variables travel sealed (see notify) and are opened only
 * here; the job leaves Redis as soon as it has ended, sent or given up. A failed attempt's error stays
 * in the job (BullMQ's failedReason and stack trace) until the retry: SMTP answers often quote the
 * recipient, so only the error's code, reply code and command go there and to the logs.
 */
export const sendEmailProcessor = defineProcessor(sendEmail, {
  async process(payload, { c, log }) {
    let opened: z.infer<typeof Sealed>;
    try {
      opened = Sealed.parse(JSON.parse(c.sealer.openText(payload.sealed, mailAad(payload.template, payload.mail_id))));
    } catch {
      // Another template's or another mail's sealed message, or a changed one: retrying cannot help.
      throw new UnrecoverableError('send-email: the sealed message does not open as this template and mail id');
    }
    const mail = renderMail(payload.template, opened.vars, c.config);
    let messageId: string;
    try {
      ({ messageId } = await c.mailer.send({ to: opened.to, ...mail }));
    } catch (err) {
      const e = err as { code?: unknown; responseCode?: unknown; command?: unknown };
      const facts = { code: safeWord(e.code), response_code: typeof e.responseCode === 'number' ? e.responseCode : undefined, command: safeWord(e.command) };
      log.warn({ template: payload.template, mail_id: payload.mail_id, ...facts }, 'email not sent');
      const what = `send-email: not sent (${[facts.code, facts.response_code, facts.command].filter((x) => x !== undefined).join(' ') || 'error'})`;
      // A 5xx reply is permanent (unknown mailbox, refused sender): the same mail would be refused again.
      throw facts.response_code !== undefined && facts.response_code >= 500 ? new UnrecoverableError(what) : new Error(what);
    }
    log.info({ template: payload.template, mail_id: payload.mail_id, messageId }, 'email sent');
    return { message_id: messageId };
  },
});

/** An error code or SMTP command (EENVELOPE, RCPT TO), never free text that could quote an address. */
function safeWord(v: unknown): string | undefined {
  return typeof v === 'string' && /^[A-Z][A-Z _]{0,31}$/i.test(v) && !v.includes('@') ? v : undefined;
}
