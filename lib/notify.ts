import { randomUUID } from 'node:crypto';
import type { Container } from './container';
import type { MailTemplate } from './mail-templates';
import { mailAad } from '../jobs/send-email';

/**
 * Queues a templated email on the `notify` queue. The recipient and the variables travel sealed under
 * the master key (some are secrets: reset tokens; the address is personal data), bound to the template
 * and a per-mail id, so Redis holds neither in clear and a sealed value cannot be replayed as another
 * mail. A failure to queue is logged, not thrown: the change the email reports has already happened.
 */
export async function notify(c: Container, to: string, template: MailTemplate, vars: Record<string, string>, requestId?: string): Promise<void> {
  const mail_id = randomUUID();
  try {
    const sealed = c.sealer.seal(JSON.stringify({ to, vars }), mailAad(template, mail_id));
    await c.jobs.enqueue('send-email', { mail_id, template, sealed }, { meta: { requestId } });
  } catch (err) {
    c.log.error({ err, template, request_id: requestId }, 'could not queue email');
  }
}
