import { z } from 'zod';
import { route } from '../../route';
import { Email, PageQuery, Password, Timestamp, pageOf } from '../../schemas/common';
import { ApiKeyStatus, CompanyName, Session, User, Username, userOut } from '../../schemas/account-fields';
import * as accounts from '../../../lib/accounts/user-accounts';
import { currentPartnerKeyStatus } from '../../../lib/accounts/partner-keys';
import { auditPage } from '../../../lib/audit/audit-log';
import { invalid } from '../../../lib/errors';
import { consume } from '../../../lib/auth/limiters';

const tags = ['Profile'];

/** Bounds of the account's automatic rotation policy, in days. */
export const ROTATION_DAYS = { min: 1, max: 730 } as const;

const ActivityItem = z
  .object({ action: z.string(), status: z.enum(['success', 'failure']), target: z.string().nullable(), ip: z.string().nullable(), created_at: Timestamp })
  .meta({ id: 'ActivityItem' });

export default [
  route({
    method: 'put',
    path: '/profile/update',
    summary: 'Update username and/or company name; a new email (with current_password) takes effect once confirmed from the new address',
    tags,
    access: 'session',
    recentSignIn: { when: (b, user) => accounts.isEmailChange(b.email, user.email), description: 'To change the email' },
    body: z.object({
      username: Username.optional(),
      email: Email.optional().describe('Mailed a confirmation token (POST /profile/confirm-email); the email changes once it is confirmed'),
      company_name: CompanyName.optional(),
      current_password: z.string().min(1).max(256).optional().describe('Required to change the email (not when `email` is the current address)'),
    }),
    responses: { 200: { description: 'The user (with the email as it still is)', schema: User.extend({ pending_email: z.string().nullable() }) } },
    async handler({ c, body, user, meta }) {
      const { email, current_password, ...rest } = body;
      const patch = Object.fromEntries(Object.entries(rest).filter(([, v]) => v !== undefined));
      if (!Object.keys(patch).length && !email) throw invalid('validation_failed', 'Give at least one of username, email, company_name.');
      // The password check comes first: a wrong one changes nothing.
      if (email) await accounts.requestEmailChange(c, user.id, email, current_password, meta);
      const row = Object.keys(patch).length ? await accounts.updateProfile(c, user.id, patch, meta) : await accounts.currentUser(c, user.id);
      return { body: { ...userOut(row), pending_email: accounts.isEmailChange(email, row.email) ? email : null } };
    },
  }),

  route({
    method: 'post',
    path: '/profile/confirm-email',
    summary: 'Confirm an email change with the token mailed to the new address (single use); the old address is told',
    tags,
    access: 'public',
    body: z.object({ token: z.string().min(1).max(256) }),
    responses: { 200: { description: 'The user with the new, verified email', schema: User } },
    async handler({ c, body, meta }) {
      await consume(c.limiters.publicIp, `confirm-email:${meta.ip}`, 'Too many requests from this address.');
      return { body: userOut(await accounts.confirmEmailChange(c, body.token, meta)) };
    },
  }),

  route({
    method: 'post',
    path: '/profile/confirm-email/resend',
    summary: "Mail a new token confirming the account's email address (as registration does); 409 once it is confirmed",
    tags,
    access: 'session',
    body: z.object({}).strict(),
    responses: {
      202: { description: 'A confirmation is on its way to the address', schema: z.object({ email: z.string() }) },
      409: { description: '`email_already_verified`' },
    },
    async handler({ c, user, meta }) {
      return { status: 202, body: await accounts.resendEmailVerification(c, user.id, meta) };
    },
  }),

  route({
    method: 'post',
    path: '/profile/change-password',
    summary: 'Change the password; every other session ends and a new token is returned',
    tags,
    access: 'session',
    body: z.object({ current_password: z.string().min(1).max(256), new_password: Password }).refine((b) => b.current_password !== b.new_password, {
      message: 'must differ from the current password',
      path: ['new_password'],
    }),
    responses: { 200: { description: 'A fresh session', schema: z.object({ session: Session }) } },
    async handler({ c, body, user, meta }) {
      return { body: { session: await accounts.changePassword(c, user.id, body, meta) } };
    },
  }),

  route({
    method: 'get',
    path: '/profile/api-key',
    summary: 'Metadata of the current partner API key (never its value)',
    tags,
    access: 'auth',
    scope: 'account:read',
    responses: { 200: { description: 'Key metadata', schema: ApiKeyStatus } },
    async handler({ c, user }) {
      return { body: await currentPartnerKeyStatus(c, user.id) };
    },
  }),

  route({
    method: 'get',
    path: '/profile/recent-activity',
    summary: 'Recent activity of the account, from the audit log',
    tags,
    access: 'auth',
    scope: 'audit:read',
    query: PageQuery,
    responses: { 200: { description: 'Newest first', schema: pageOf(ActivityItem) } },
    async handler({ user, query, reader }) {
      const { items, total } = await auditPage(await reader(), { userId: user.id, page: query.page, pageSize: query.page_size });
      return { body: { items: items.map((r) => ({ ...r, created_at: r.created_at.toISOString() })), page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'post',
    path: '/profile/update-rotation-days',
    summary: `Set the automatic key rotation policy in days (${ROTATION_DAYS.min}–${ROTATION_DAYS.max}), or null to turn it off`,
    tags,
    access: 'auth',
    scope: 'keys:write',
    body: z.object({ rotation_interval_days: z.number().int().min(ROTATION_DAYS.min).max(ROTATION_DAYS.max).nullable() }),
    responses: { 200: { description: 'The stored policy', schema: z.object({ rotation_interval_days: z.number().int().nullable() }) } },
    async handler({ c, body, user, meta }) {
      const row = await accounts.setRotationPolicy(c, user.id, body.rotation_interval_days, meta);
      return { body: { rotation_interval_days: row.rotation_days } };
    },
  }),

  route({
    method: 'post',
    path: '/profile/delete-account',
    summary: 'Delete the current account (needs the password; refused for administrators)',
    tags,
    access: 'session',
    recentSignIn: true,
    body: z.object({ password: z.string().min(1).max(256) }),
    responses: { 200: { description: 'Deleted', schema: z.object({ status: z.literal('deleted') }) } },
    async handler({ c, body, user, meta }) {
      await accounts.deleteAccount(c, user.id, body.password, meta);
      return { body: { status: 'deleted' } };
    },
  }),
];
