import { z } from 'zod';
import { route } from '../../route';
import { Email, Password } from '../../schemas/common';
import { consume } from '../../../lib/auth/limiters';
import * as accounts from '../../../lib/accounts/user-accounts';

const tags = ['Authentication'];

const Accepted = z.object({ status: z.literal('accepted'), message: z.string() });

export default [
  route({
    method: 'post',
    path: '/auth/forgot-password',
    summary: 'Request a password reset email (same answer whether or not the account exists)',
    tags,
    access: 'public',
    body: z.object({ email: Email }),
    responses: { 202: { description: 'Accepted', schema: Accepted } },
    async handler({ c, body, meta }) {
      await consume(c.limiters.publicIp, `forgot:${meta.ip}`, 'Too many requests from this address.');
      await accounts.forgotPassword(c, body.email, meta);
      return { status: 202, body: { status: 'accepted', message: 'If an account with this email exists, a reset email is on its way.' } };
    },
  }),

  route({
    method: 'post',
    path: '/auth/reset-password',
    summary: 'Set a new password with a reset token (single use; ends every session)',
    tags,
    access: 'public',
    body: z.object({ token: z.string().min(1).max(256), new_password: Password }),
    responses: { 200: { description: 'Password changed', schema: z.object({ status: z.literal('password_reset') }) } },
    async handler({ c, body, meta }) {
      await consume(c.limiters.publicIp, `reset:${meta.ip}`, 'Too many requests from this address.');
      await accounts.resetPassword(c, body, meta);
      return { body: { status: 'password_reset' } };
    },
  }),
];
