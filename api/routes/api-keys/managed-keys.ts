import { z } from 'zod';
import { route } from '../../route';
import { PageQuery, Timestamp, iso, isoOrNull, pageOf, text } from '../../schemas/common';
import { SCOPES, SCOPE_DESCRIPTIONS } from '../../../lib/auth/scopes';
import type { ApiKeyRow } from '../../../db/api-keys';
import { MAX_LIFETIME_DAYS, apiKeyState, generateApiKey, listApiKeys, readApiKey, revokeApiKey, rotateApiKey } from '../../../lib/accounts/api-keys';
import type { Container } from '../../../lib/container';
import { requestHash } from '../../../lib/jobs/job-records';
import { idempotencyKey } from '../../job-reply';

/**
 * Managed API keys (`kms_sk_…`). Managing them needs a session: an API key never creates, reads,
 * rotates or revokes API keys (a leaked key must not mint or keep itself alive).
 */
const tags = ['Managed API keys'];

const Params = z.object({ key_id: z.uuid() });
const Status = z.enum(['active', 'expired', 'revoked']);
const MAX_GRACE_SECONDS = 7 * 86400;

const Scopes = z
  .array(z.enum(SCOPES))
  .min(1)
  .max(SCOPES.length)
  .transform((scopes) => [...new Set(scopes)])
  .describe(`What the key may do: ${SCOPES.map((s) => `\`${s}\` (${SCOPE_DESCRIPTIONS[s]})`).join('; ')}.`);

const ApiKey = z
  .object({
    key_id: z.uuid(),
    name: z.string(),
    prefix: z.string().describe('The first characters of the current value (`kms_sk_` + 6), safe to show'),
    scopes: z.array(z.enum(SCOPES)),
    status: Status,
    created_at: Timestamp,
    expires_at: Timestamp.nullable().describe('null: never expires'),
    revoked_at: Timestamp.nullable(),
    last_rotated_at: Timestamp.nullable(),
    previous_value_expires_at: Timestamp.nullable().describe('When the value replaced by the latest rotation stops (stopped) working'),
    last_used_at: Timestamp.nullable(),
    use_count: z.number().int().describe('Authenticated requests made with the key (any of its values)'),
    bytes_encrypted: z.number().int().describe('Plaintext bytes of completed encrypt jobs the key submitted'),
    bytes_decrypted: z.number().int().describe('Plaintext bytes of completed decrypt jobs the key submitted'),
  })
  .meta({ id: 'ManagedApiKey' });

const WithValue = ApiKey.extend({ value: z.string().nullable().describe('The current value (`kms_sk_…`); null once revoked') }).meta({
  id: 'ManagedApiKeyWithValue',
});

const view = (c: Container, row: ApiKeyRow) => ({
  key_id: row.id,
  name: row.name,
  prefix: row.prefix,
  scopes: row.scopes,
  status: apiKeyState(row, c.clock.now()),
  created_at: iso(row.created_at),
  expires_at: isoOrNull(row.expires_at),
  revoked_at: isoOrNull(row.revoked_at),
  last_rotated_at: isoOrNull(row.last_rotated_at),
  previous_value_expires_at: isoOrNull(row.previous_value_expires_at),
  last_used_at: isoOrNull(row.last_used_at),
  use_count: row.use_count,
  bytes_encrypted: row.bytes_encrypted,
  bytes_decrypted: row.bytes_decrypted,
});

export default [
  route({
    method: 'post',
    path: '/api-keys/generate',
    summary:
      'Generate a managed API key with scopes and an optional expiry; answers its value. An `Idempotency-Key` header makes a retry safe: the same key and body answer the key made first (its current value), another body 422 `idempotency_key_reused`',
    tags,
    access: 'session',
    recentSignIn: true,
    body: z
      .object({
        name: text(100),
        scopes: Scopes,
        expires_at: Timestamp.optional().describe('When the key stops working (in the future); or use expires_in_days'),
        expires_in_days: z.number().int().min(1).max(MAX_LIFETIME_DAYS).optional(),
      })
      .refine((b) => b.expires_at === undefined || b.expires_in_days === undefined, {
        message: 'give expires_at or expires_in_days, not both',
        path: ['expires_at'],
      }),
    responses: { 201: { description: 'The key and its value', schema: WithValue } },
    async handler({ c, ctx, user, body, meta }) {
      // As job submissions: the same Idempotency-Key and request answer the key it made; another request is refused.
      const key = idempotencyKey(ctx);
      const { row, value } = await generateApiKey(
        c,
        user.id,
        { name: body.name, scopes: body.scopes, expires_at: body.expires_at ? new Date(body.expires_at) : undefined, expires_in_days: body.expires_in_days },
        meta,
        key ? { key, hash: requestHash('api_keys.generate', body) } : undefined,
      );
      return { status: 201, body: { ...view(c, row), value } };
    },
  }),

  route({
    method: 'get',
    path: '/api-keys',
    summary: "The account's managed API keys: metadata and usage, never values",
    tags,
    access: 'session',
    query: PageQuery.extend({ status: Status.optional() }),
    responses: { 200: { description: 'A page of keys, newest first', schema: pageOf(ApiKey) } },
    async handler({ c, user, query, reader }) {
      const { items, total } = await listApiKeys(await reader(), user.id, { state: query.status, page: query.page, pageSize: query.page_size });
      return { body: { items: items.map((row) => view(c, row)), page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'get',
    path: '/api-keys/{key_id}',
    summary: 'One managed API key with its current value (the read is audited)',
    tags,
    access: 'session',
    params: Params,
    responses: { 200: { description: 'The key and its value', schema: WithValue } },
    async handler({ c, ctx, user, params, meta }) {
      const { row, value } = await readApiKey(c, user.id, params.key_id, meta);
      ctx.set('Cache-Control', 'no-store');
      return { body: { ...view(c, row), value } };
    },
  }),

  route({
    method: 'post',
    path: '/api-keys/{key_id}/rotate',
    summary: 'A new value for the key; the old one keeps working for `grace_seconds` (default 0: it stops at once)',
    tags,
    access: 'session',
    recentSignIn: true,
    params: Params,
    body: z.object({
      grace_seconds: z.number().int().min(0).max(MAX_GRACE_SECONDS).optional().describe('How long the old value keeps working (0 to 7 days; default 0)'),
    }),
    responses: { 200: { description: 'The key with its new value; `previous_value_expires_at` is when the old value stops', schema: WithValue } },
    async handler({ c, user, params, body, meta }) {
      const { row, value } = await rotateApiKey(c, user.id, params.key_id, (body.grace_seconds ?? 0) * 1000, meta);
      return { body: { ...view(c, row), value } };
    },
  }),

  route({
    method: 'delete',
    path: '/api-keys/{key_id}',
    summary: 'Revoke the key at once (every value of it); repeating it is harmless',
    tags,
    access: 'session',
    params: Params,
    responses: { 204: { description: 'Revoked' } },
    async handler({ c, user, params, meta }) {
      await revokeApiKey(c, user.id, params.key_id, meta);
      return { status: 204 };
    },
  }),
];
