import type { Container } from '../container';
import type { MailTemplate } from '../mail-templates';

/**
 * Queues a templated email on the `notify` queue. Its variables travel sealed under the master key,
 * because some (reset tokens) are secrets. A failure to queue is logged, not thrown: the change the
 * email reports has already happened and must not turn into an error.
 */
export async function notify(c: Container, to: string, template: MailTemplate, vars: Record<string, string>, requestId?: string): Promise<void> {
  try {
    await c.jobs.enqueue('send-email', { to, template, sealed_vars: c.sealer.seal(JSON.stringify(vars), 'send-email') }, { meta: { requestId } });
  } catch (err) {
    c.log.error({ err, template, request_id: requestId }, 'could not queue email');
  }
}
