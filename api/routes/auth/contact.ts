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
    body: z.object({
      name: text(200),
      email: Email,
      subject: text(200).optional().describe('Optional; without it the request is filed as "Contact request from <name>"'),
      message: multilineText(10_000),
    }),
    responses: { 202: { description: 'Received', schema: z.object({ status: z.literal('received'), reference: z.uuid() }) } },
    async handler({ c, body, user, meta }) {
      await consume(c.limiters.publicIp, `contact:${meta.ip}`, 'Too many requests from this address.');
      const request = { ...body, subject: body.subject ?? `Contact request from ${body.name}` };
      const id = await accounts.submitContactRequest(c, request, user?.id ?? null, meta);
      // Forwarded to support only: a public form that mails arbitrary addresses would be a spam relay.
      await notify(c, c.config.mail.support, 'contact-forward', { ...request, reference: id }, meta.requestId);
      return { status: 202, body: { status: 'received', reference: id } };
    },
  }),
];
