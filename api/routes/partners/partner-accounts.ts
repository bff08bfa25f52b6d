import { z } from 'zod';
import { route } from '../../route';
import { Email, Password, Timestamp } from '../../schemas/common';
import { ApiKeyStatus, CompanyName, Session, User, Username, userOut } from '../../schemas/account-fields';
import { consume } from '../../../lib/auth/limiters';
import * as accounts from '../../../lib/accounts/user-accounts';
import { rotatePartnerKey, currentPartnerKeyStatus } from '../../../lib/accounts/partner-keys';

const tags = ['Partners'];

const IssuedKey = z
  .object({
    api_key: z.string().describe('Shown once; store it now. Send as "Authorization: Bearer <api_key>".'),
    prefix: z.string(),
    expires_at: Timestamp,
  })
  .meta({ id: 'IssuedPartnerKey' });

export default [
  route({
    method: 'post',
    path: '/partners/register',
    summary: 'Register a partner account; issues a partner API key (shown once) and a session',
    tags,
    access: 'public',
    body: z.object({ username: Username, email: Email, password: Password, company_name: CompanyName.optional() }),
    responses: { 201: { description: 'Registered', schema: z.object({ user: User, session: Session, partner_api_key: IssuedKey }) } },
    async handler({ c, body, meta }) {
      await consume(c.limiters.publicIp, `register:${meta.ip}`, 'Too many registrations from this address.');
      const { user, key, session } = await accounts.register(c, body, meta);
      return {
        status: 201,
        headers: { 'Cache-Control': 'no-store' },
        body: { user: userOut(user), session, partner_api_key: { api_key: key.value, prefix: key.row.prefix, expires_at: key.row.expires_at.toISOString() } },
      };
    },
  }),

  route({
    method: 'post',
    path: '/partners/rotate-api-key',
    summary: 'Rotate the partner API key: a new key (shown once); the old one stops working at once. Needs a session: a key cannot replace itself',
    tags,
    access: 'session',
    recentSignIn: true,
    responses: { 200: { description: 'The new key', schema: IssuedKey } },
    async handler({ c, user, meta }) {
      const key = await rotatePartnerKey(c, user.id, user.via, meta);
      return { headers: { 'Cache-Control': 'no-store' }, body: { api_key: key.value, prefix: key.row.prefix, expires_at: key.row.expires_at.toISOString() } };
    },
  }),

  route({
    method: 'get',
    path: '/partners/api-key-status',
    summary: 'Status and expiry of the current partner API key',
    tags,
    access: 'auth',
    scope: 'account:read',
    responses: { 200: { description: 'Key status', schema: ApiKeyStatus } },
    async handler({ c, user }) {
      return { body: await currentPartnerKeyStatus(c, user.id) };
    },
  }),
];
