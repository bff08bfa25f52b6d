import { z } from 'zod';
import { route } from '../../route';
import { PageQuery, Timestamp, pageOf } from '../../schemas/common';
import { SCOPES } from '../../../lib/auth/scopes';
import { SHARE_STATES, SHARE_VIEW_HEADERS, revokeShare } from '../../../lib/sharing/share-links';
import {
  DEFAULT_SHARE_HOURS,
  MAX_SHARE_HOURS,
  MAX_SHARE_VIEWS,
  createApiKeyShare,
  listApiKeyShares,
  peekApiKeyShare,
  viewApiKeyShare,
} from '../../../lib/sharing/api-key-shares';
import { apiKeyRevealPage, apiKeyValuePage, sendPage, wantsPage, withErrorPage } from '../../share-page';

/**
 * Managed API key share links (SPEC.md): a link that hands out a key's current value a limited number
 * of times. Managing them needs a session, as managing the keys does (a leaked key must not hand itself
 * out); the value is read through the public link. Order matters: @koa/router runs the first matching
 * route, and `/api-keys/shared/{share_token}` comes before `/api-keys/{key_id}/shares`, which matches
 * `/api-keys/shared/shares` too.
 */
const tags = ['Managed API keys'];

const KeyParams = z.object({ key_id: z.uuid() });

const ApiKeyShare = z
  .object({
    share_id: z.uuid().describe('Revoke with DELETE /api-keys/shares/{share_id}'),
    key_id: z.uuid(),
    key_name: z.string(),
    key_prefix: z.string().describe("The first characters of the key's current value, safe to show"),
    key_status: z.enum(['active', 'expired', 'revoked']).describe('A revoked or expired key’s links answer 410 whatever their own state'),
    state: z.enum(SHARE_STATES),
    expires_at: Timestamp.nullable(),
    max_views: z.number().int().nullable(),
    view_count: z.number().int(),
    views_remaining: z.number().int().nullable(),
    last_viewed_at: Timestamp.nullable(),
    revoked_at: Timestamp.nullable(),
    created_at: Timestamp,
    share_token: z
      .string()
      .nullable()
      .describe('`kms_as_…` while the share is active (kept sealed); null once it is not, and for shares made before tokens were kept'),
    url: z.string().nullable().describe('The public link while the share is active, to give again to whoever should have it; null as share_token'),
  })
  .meta({ id: 'ApiKeyShare' });

const CreatedShare = ApiKeyShare.extend({
  share_token: z.string().describe('`kms_as_…`: stored as a hash for lookup and sealed for the share list'),
  url: z.string().describe('The public link; each JSON GET of it is one view (a browser gets a page that spends the view only on Reveal)'),
}).meta({ id: 'CreatedApiKeyShare' });

const CreateBody = z
  .object({
    expires_at: Timestamp.optional().describe(`When the link stops working (in the future, within ${MAX_SHARE_HOURS} hours)`),
    expires_in_hours: z.number().int().min(1).max(MAX_SHARE_HOURS).optional().describe(`Or: hours from now (default ${DEFAULT_SHARE_HOURS})`),
    max_views: z.number().int().min(1).max(MAX_SHARE_VIEWS).optional().describe('Views the link allows (default 1)'),
  })
  .refine((b) => !(b.expires_at && b.expires_in_hours), { message: 'give at most one of expires_at and expires_in_hours', path: ['expires_at'] });

const SharedKey = z
  .object({
    key_id: z.uuid(),
    name: z.string(),
    prefix: z.string(),
    scopes: z.array(z.enum(SCOPES)),
    value: z.string().describe('The key’s current value (`kms_sk_…`): a rotated key’s link gives the new value'),
    expires_at: Timestamp.nullable().describe("The key's expiry"),
    share_expires_at: Timestamp.nullable(),
    views_remaining: z.number().int().nullable(),
  })
  .meta({ id: 'SharedApiKey' });

const HOUR_MS = 3_600_000;

const TokenParams = z.object({ share_token: z.string().min(1).max(256) });
/** A secret: never cached, never indexed, never sent on as a Referer. */
const SECRET_HEADERS = { 'Cache-Control': 'no-store', ...SHARE_VIEW_HEADERS };

export default [
  route({
    method: 'get',
    path: '/api-keys/shared/{share_token}',
    summary:
      "Public: the shared API key's current value. Each JSON view counts; a browser (`Accept: text/html`) gets a page whose Reveal button (POST) spends the view instead; used up, revoked, expired or the key revoked/expired: 410; rate limited per address",
    tags,
    access: 'public',
    params: TokenParams,
    responses: { 200: { description: 'The key and its current value (`text/html`: the page offering to reveal it, no view spent)', schema: SharedKey } },
    async handler({ c, ctx, params, meta }) {
      // Browsers and link previewers fetch a link on their own: the page shows which key, and only its form spends the view.
      if (wantsPage(ctx))
        return withErrorPage(ctx, SECRET_HEADERS, async () => {
          const peek = await peekApiKeyShare(c, { token: params.share_token }, meta);
          sendPage(ctx, { headers: SECRET_HEADERS, ...apiKeyRevealPage(peek) });
        });
      const shared = await viewApiKeyShare(c, { token: params.share_token, userAgent: ctx.get('user-agent') }, meta);
      return { headers: SECRET_HEADERS, body: shared };
    },
  }),

  route({
    method: 'post',
    path: '/api-keys/shared/{share_token}',
    summary: "Public: the shared API key's current value, as GET answers it (one view); what the page's Reveal button sends, answered as a page to a browser",
    tags,
    access: 'public',
    params: TokenParams,
    responses: { 200: { description: 'The key and its current value (`text/html`: a page showing it once)', schema: SharedKey } },
    async handler({ c, ctx, params, meta }) {
      const view = () => viewApiKeyShare(c, { token: params.share_token, userAgent: ctx.get('user-agent') }, meta);
      if (wantsPage(ctx))
        return withErrorPage(ctx, SECRET_HEADERS, async () => {
          sendPage(ctx, { headers: SECRET_HEADERS, ...apiKeyValuePage(await view()) });
        });
      return { headers: SECRET_HEADERS, body: await view() };
    },
  }),

  route({
    method: 'post',
    path: '/api-keys/{key_id}/share',
    summary: `A share link to the key's value: expires in ${DEFAULT_SHARE_HOURS} h and allows one view unless told otherwise; answers the token and URL once`,
    tags,
    access: 'session',
    recentSignIn: true,
    params: KeyParams,
    body: CreateBody,
    responses: { 201: { description: 'The share, with its token and link (shown once)', schema: CreatedShare } },
    async handler({ c, user, params, body, meta }) {
      const now = c.clock.now().getTime();
      const expiresAt = body.expires_at ? new Date(body.expires_at) : new Date(now + (body.expires_in_hours ?? DEFAULT_SHARE_HOURS) * HOUR_MS);
      const created = await createApiKeyShare(c, user.id, params.key_id, { expiresAt, maxViews: body.max_views ?? 1 }, meta);
      return { status: 201, headers: { 'Cache-Control': 'no-store' }, body: { ...created.share, share_token: created.token, url: created.url } };
    },
  }),

  route({
    method: 'get',
    path: '/api-keys/{key_id}/shares',
    summary: "The key's share links with their state, view counts and, while active, their links",
    tags,
    access: 'session',
    params: KeyParams,
    query: PageQuery.extend({ state: z.enum(SHARE_STATES).optional() }),
    responses: { 200: { description: 'A page of shares, newest first', schema: pageOf(ApiKeyShare) } },
    async handler({ c, user, params, query, meta, reader }) {
      const { items, total } = await listApiKeyShares(
        c,
        user.id,
        params.key_id,
        { state: query.state, page: query.page, pageSize: query.page_size },
        meta,
        await reader(),
      );
      return { body: { items, page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'delete',
    path: '/api-keys/shares/{share_id}',
    summary: 'Revoke an API key share link at once (repeating it is harmless)',
    tags,
    access: 'session',
    params: z.object({ share_id: z.uuid() }),
    responses: { 204: { description: 'Revoked (or already revoked)' } },
    async handler({ c, user, params, meta }) {
      await revokeShare(c, user.id, 'api_key', params.share_id, meta);
      return { status: 204 };
    },
  }),
];
