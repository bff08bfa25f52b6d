import { z } from 'zod';
import { route } from '../../route';
import { Email, PageQuery, Timestamp, pageOf } from '../../schemas/common';
import { Fingerprint, Profile } from '../../schemas/key-fields';
import { UA_CLASSES, SHARE_STATES, SHARE_VIEW_HEADERS } from '../../../lib/sharing/share-links';
import { createKeyShare, keyShareAnalytics, keyShareUrl, listKeyShares, revokeKeyShare, viewKeyShare } from '../../../lib/sharing/key-shares';
import { publicKeyPage, sendPage, wantsPage, withErrorPage } from '../../share-page';

/**
 * Public key sharing (SPEC.md): tokenized links to a key lineage's current public key. Order matters:
 * @koa/router runs every route whose template matches, in this order, and the first that answers wins;
 * `/keys/share/` and `/keys/share/analytics` come before `/keys/share/{share_token}`, which would match
 * them too. The rotation routes (`/keys/{fingerprint}/...`, mounted earlier) have three segments after
 * `/keys` and never match these.
 */
const tags = ['Public key sharing'];

const KeyShare = z
  .object({
    share_id: z.uuid().describe('Revoke with DELETE /keys/share/{share_id}'),
    lineage_id: z.uuid().describe('The key (lineage) shared: the link follows its rotations'),
    fingerprint: z.string().nullable().describe("The key's current generation"),
    label: z.string().nullable(),
    key_status: z.enum(['active', 'disabled', 'expired']).nullable().describe('A disabled key’s links answer 410 `key_disabled`'),
    state: z.enum(SHARE_STATES),
    expires_at: Timestamp.nullable(),
    max_views: z.number().int().nullable(),
    view_count: z.number().int(),
    views_remaining: z.number().int().nullable(),
    last_viewed_at: Timestamp.nullable(),
    revoked_at: Timestamp.nullable(),
    recipient_email: z.string().nullable().describe('Who was sent the notice (stored sealed)'),
    created_at: Timestamp,
    created_by: z.object({ user_id: z.uuid(), username: z.string() }).describe('Who made the share: you, or a teammate sharing your key through team access'),
    share_token: z
      .string()
      .nullable()
      .describe('`kms_ks_…` while the share is active (kept sealed); null once it is not, and for shares made before tokens were kept'),
    url: z.string().nullable().describe('The public link while the share is active, to give again to someone who has it; null as share_token'),
  })
  .meta({ id: 'KeyShare' });

const CreatedShare = KeyShare.extend({
  share_token: z.string().describe('`kms_ks_…`: stored as a hash for lookup and sealed for your lists'),
  url: z
    .string()
    .describe('The public link: GET it (JSON), in a browser (`Accept: text/html`) a page, with `Accept: application/pgp-keys` or `?format=asc` the bare key'),
  notice_queued: z.boolean().describe('A notice to recipient_email was queued (sent by a worker, not awaited)'),
}).meta({ id: 'CreatedKeyShare' });

const CreateBody = z
  .object({
    fingerprint: Fingerprint.describe("Any generation's fingerprint of the key to share"),
    expires_at: Timestamp.optional().describe('When the link stops working (in the future)'),
    expires_in_hours: z
      .number()
      .int()
      .min(1)
      .max(24 * 365)
      .optional()
      .describe('Or: hours from now'),
    max_views: z.number().int().min(1).max(1_000_000).optional().describe('Views the link allows; none: unlimited'),
    recipient_email: Email.optional().describe('Sends this address a notice with the link and the fingerprint'),
  })
  .refine((b) => !(b.expires_at && b.expires_in_hours), { message: 'give at most one of expires_at and expires_in_hours', path: ['expires_at'] });

const SharedKey = z
  .object({
    fingerprint: z.string(),
    label: z.string(),
    algorithm: z.string(),
    profile: Profile.describe('rfc4880: a v4 key every OpenPGP tool reads; rfc9580 and pqc: v6 keys (docs/openpgp-profiles.md)'),
    uid: z.string().describe('The OpenPGP user id, "Name <email>"'),
    status: z.enum(['active', 'expired']),
    generation: z.number().int().describe('Increases with each rotation; the link serves the current one'),
    expires_at: Timestamp.nullable().describe("The key's expiry"),
    public_key: z.string().describe('ASCII-armored OpenPGP public key'),
    share_expires_at: Timestamp.nullable(),
    views_remaining: z.number().int().nullable(),
  })
  .meta({ id: 'SharedPublicKey' });

const Analytics = z
  .object({
    totals: z.object({
      active: z.number().int(),
      expired: z.number().int(),
      revoked: z.number().int(),
      exhausted: z.number().int(),
      shares: z.number().int(),
      views: z.number().int(),
    }),
    views_by_day: z
      .array(z.object({ day: z.string().describe('UTC day, YYYY-MM-DD'), views: z.number().int() }))
      .describe('The last 30 days, oldest first, zeros included'),
    top_keys: z
      .array(
        z.object({ lineage_id: z.uuid(), fingerprint: z.string().nullable(), label: z.string().nullable(), views: z.number().int(), shares: z.number().int() }),
      )
      .describe('Most viewed keys (up to 10)'),
    recent_views: z
      .array(z.object({ viewed_at: Timestamp, share_id: z.uuid(), lineage_id: z.uuid(), ua_class: z.enum(UA_CLASSES) }))
      .describe('The latest views (up to 20); never addresses or raw user agents'),
  })
  .meta({ id: 'KeyShareAnalytics' });

const HOUR_MS = 3_600_000;

export default [
  route({
    method: 'post',
    path: '/keys/share/create',
    summary: "Share a key's public key through a tokenized link (it follows rotations); optionally notify a recipient by email",
    tags,
    access: 'auth',
    scope: 'shares:write',
    body: CreateBody,
    responses: { 201: { description: 'The share, with its token and link (shown once)', schema: CreatedShare } },
    async handler({ c, user, body, meta }) {
      const expiresAt = body.expires_at
        ? new Date(body.expires_at)
        : body.expires_in_hours
          ? new Date(c.clock.now().getTime() + body.expires_in_hours * HOUR_MS)
          : null;
      const created = await createKeyShare(
        c,
        user,
        { fingerprint: body.fingerprint, expiresAt, maxViews: body.max_views ?? null, recipientEmail: body.recipient_email ?? null },
        meta,
      );
      return { status: 201, body: { ...created.share, share_token: created.token, url: created.url, notice_queued: created.notice_queued } };
    },
  }),

  route({
    method: 'get',
    path: '/keys/share/',
    summary:
      'Your public key shares, and every share of your own keys whoever made it, with their view counts and, while active, their links; filters: fingerprint, state',
    tags,
    access: 'auth',
    scope: 'shares:read',
    query: PageQuery.extend({
      fingerprint: Fingerprint.optional().describe("Shares of this key (any generation's fingerprint)"),
      state: z.enum(SHARE_STATES).optional(),
    }),
    responses: { 200: { description: 'A page of shares, newest first', schema: pageOf(KeyShare) } },
    async handler({ c, user, query, meta, reader }) {
      const { items, total } = await listKeyShares(
        c,
        user.id,
        { fingerprint: query.fingerprint, state: query.state, page: query.page, pageSize: query.page_size },
        meta,
        await reader(),
      );
      return { body: { items, page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'get',
    path: '/keys/share/analytics',
    summary: 'Share analytics: shares by state, views per day (30 days), most viewed keys, recent views',
    tags,
    access: 'auth',
    scope: 'shares:read',
    responses: { 200: { description: 'The numbers', schema: Analytics } },
    async handler({ user, reader }) {
      return { body: await keyShareAnalytics(await reader(), user.id) };
    },
  }),

  route({
    method: 'get',
    path: '/keys/share/{share_token}',
    summary:
      'Public: the shared key’s current public key: JSON; the armored key with `?format=asc` or `Accept: application/pgp-keys`; a page for a browser (`Accept: text/html`). Each view counts; rate limited per address',
    tags,
    access: 'public',
    params: z.object({ share_token: z.string().min(1).max(256) }),
    query: z.object({ format: z.enum(['asc']).optional().describe('`asc`: the armored key alone, as a download (what the page links to)') }),
    responses: {
      200: {
        description:
          'The public key and its facts; `application/pgp-keys`: the armored key alone; `text/html`: a page with the fingerprint, expiry, the download and the `gpg --import` line (errors too answer a page)',
        schema: SharedKey,
      },
    },
    async handler({ c, ctx, params, query, meta }) {
      const view = () => viewKeyShare(c, { token: params.share_token, userAgent: ctx.get('user-agent') }, meta);
      if (query.format === 'asc' || ctx.accepts('application/json', 'application/pgp-keys') === 'application/pgp-keys') {
        const shared = await view();
        ctx.set(SHARE_VIEW_HEADERS);
        ctx.set('Content-Disposition', `attachment; filename="${shared.fingerprint}.asc"`);
        ctx.type = 'application/pgp-keys';
        ctx.body = shared.public_key;
        return;
      }
      if (wantsPage(ctx))
        return withErrorPage(ctx, SHARE_VIEW_HEADERS, async () => {
          sendPage(ctx, { headers: SHARE_VIEW_HEADERS, ...publicKeyPage(await view(), keyShareUrl(c, params.share_token)) });
        });
      return { headers: { ...SHARE_VIEW_HEADERS }, body: await view() };
    },
  }),

  route({
    method: 'delete',
    path: '/keys/share/{share_id}',
    summary: 'Revoke a share you made, or any share of your own keys, at once (repeating it is harmless)',
    tags,
    access: 'auth',
    scope: 'shares:write',
    params: z.object({ share_id: z.uuid() }),
    responses: { 204: { description: 'Revoked (or already revoked)' } },
    async handler({ c, user, params, meta }) {
      await revokeKeyShare(c, user.id, params.share_id, meta);
      return { status: 204 };
    },
  }),
];
