import { z } from 'zod';
import { route } from '../../route';
import { Email, multilineText, text } from '../../schemas/common';
import { consume } from '../../../lib/auth/limiters';
import * as accounts from '../../../lib/accounts/user-accounts';
import { notify } from '../../../lib/notify';

const tags = ['Authentication'];

export default [
  route({
    method: 'post',
    path: '/auth/contact',
    summary: 'Submit a support or contact request',
    tags,
    access: 'public',
    body: z.object({ name: text(200), email: Email, subject: text(200), message: multilineText(10_000) }),
    responses: { 202: { description: 'Received', schema: z.object({ status: z.literal('received'), reference: z.uuid() }) } },
    async handler({ c, body, user, meta }) {
      await consume(c.limiters.publicIp, `contact:${meta.ip}`, 'Too many requests from this address.');
      const id = await accounts.submitContactRequest(c, body, user?.id ?? null, meta);
      // Forwarded to support only: a public form that mails arbitrary addresses would be a spam relay.
      await notify(c, c.config.mail.support, 'contact-forward', { ...body, reference: id }, meta.requestId);
      return { status: 202, body: { status: 'received', reference: id } };
    },
  }),
];
