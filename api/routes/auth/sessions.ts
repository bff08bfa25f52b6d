import { z } from 'zod';
import { route } from '../../route';
import { Session, User, userOut } from '../../schemas/account-fields';
import * as accounts from '../../../lib/accounts/user-accounts';
import { CONSOLE_HEADER, clearSessionCookie, presentedCredential, setSessionCookie } from '../../middleware/browser-session';

const tags = ['Authentication'];

/** Whichever of a username and an email a login names: both are looked up (lib/accounts/user-accounts.ts login). */
const LoginName = z.string().trim().min(1).max(254);

export default [
  route({
    method: 'post',
    path: '/auth/login',
    summary: 'Log in with a username or email and a password; returns a JWT',
    tags,
    access: 'public',
    body: z
      .object({
        identifier: LoginName.optional().describe('Username or email'),
        username: LoginName.optional(),
        email: LoginName.optional(),
        password: z.string().min(1).max(256),
      })
      .refine((b) => [b.identifier, b.username, b.email].filter((v) => v !== undefined).length === 1, {
        message: 'give exactly one of identifier, username and email',
        path: ['identifier'],
      }),
    responses: { 200: { description: 'Session token and the user', schema: z.object({ session: Session, user: User }) } },
    async handler({ c, body, meta }) {
      const identifier = (body.identifier ?? body.username ?? body.email)!;
      const { user, session } = await accounts.login(c, { identifier, password: body.password }, meta);
      return { body: { session, user: userOut(user) } };
    },
  }),

  route({
    method: 'get',
    path: '/auth/me',
    summary: 'The current user profile',
    tags,
    access: 'auth',
    scope: 'account:read',
    responses: { 200: { description: 'The user', schema: User.extend({ authenticated_via: z.enum(['jwt', 'partner_key', 'api_key']) }) } },
    async handler({ c, user }) {
      const row = await accounts.currentUser(c, user.id);
      return { body: { ...userOut(row), authenticated_via: user.via } };
    },
  }),

  route({
    method: 'post',
    path: '/auth/logout',
    summary: 'End every session of the account (all its session tokens stop working); API keys are unaffected',
    tags,
    access: 'session',
    responses: { 200: { description: 'Logged out everywhere', schema: z.object({ status: z.literal('logged_out') }) } },
    async handler({ c, user, meta }) {
      await accounts.logout(c, user.id, meta);
      return { body: { status: 'logged_out' } };
    },
  }),

  route({
    method: 'post',
    path: '/auth/session',
    summary: `Keep the session token sent as Bearer in an HttpOnly, SameSite=Strict cookie for the web console; requests then authenticate with the cookie and the header \`${CONSOLE_HEADER}: 1\``,
    tags,
    access: 'session',
    responses: { 200: { description: 'The cookie is set', schema: z.object({ status: z.literal('cookie_set'), user: User }) } },
    async handler({ c, ctx, user }) {
      setSessionCookie(ctx, presentedCredential(ctx)!.token, c.config.jwt.ttlSeconds);
      return { body: { status: 'cookie_set', user: userOut(await accounts.currentUser(c, user.id)) } };
    },
  }),

  route({
    method: 'delete',
    path: '/auth/session',
    summary: "Clear the web console's session cookie (the token itself stays valid until it expires or /auth/logout ends it)",
    tags,
    access: 'public',
    responses: { 200: { description: 'The cookie is cleared', schema: z.object({ status: z.literal('cookie_cleared') }) } },
    async handler({ ctx }) {
      clearSessionCookie(ctx);
      return { body: { status: 'cookie_cleared' } };
    },
  }),
];
