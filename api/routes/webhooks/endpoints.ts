import { z } from 'zod';
import { route } from '../../route';
import { PageQuery, Timestamp, iso, isoOrNull, pageOf, text } from '../../schemas/common';
import { EVENT_TYPES, currentEventType } from '../../../lib/event-names';
import type { AttemptRow, DeliveryRow, EndpointRow } from '../../../db/webhooks';
import {
  createEndpoint,
  deleteEndpoint,
  deliveryAttempts,
  listDeliveries,
  listEndpoints,
  ownDelivery,
  ownEndpoint,
  redeliver,
  rotateSecret,
  sendTestPing,
  updateEndpoint,
} from '../../../lib/webhooks/endpoints';

const tags = ['Webhooks'];

const Url = z.string().trim().min(1).max(2048).describe('http(s) URL that receives POSTs; loopback, private and link-local addresses are refused');
/** One event type; a name from before the scheme (deprecated) is read as its current one. */
const EventTypeName = z.preprocess((v) => (typeof v === 'string' ? currentEventType(v) : v), z.enum(EVENT_TYPES).meta({ id: 'EventType' }));
const EventTypes = z
  .array(EventTypeName)
  .max(EVENT_TYPES.length)
  .transform((types) => [...new Set(types)])
  .describe('Event types to receive; empty or omitted: all');
const Params = z.object({ webhook_id: z.uuid() });
const DeliveryParams = Params.extend({ delivery_id: z.uuid() });

const Endpoint = z
  .object({
    webhook_id: z.uuid(),
    url: z.string(),
    description: z.string(),
    event_types: z.array(z.string()),
    enabled: z.boolean(),
    disabled_reason: z
      .string()
      .nullable()
      .describe(
        'Why the service turned it off: `gone` (the receiver answered 410), `password_reset` (made or changed shortly before a password reset: see GET /profile/recovery-review)',
      ),
    secret_rotation_ends_at: Timestamp.nullable().describe('Until then the previous secret signs too'),
    created_at: Timestamp,
    updated_at: Timestamp,
  })
  .meta({ id: 'WebhookEndpoint' });

const WithSecret = Endpoint.extend({ secret: z.string().describe('`whsec_…`: shown once; verify `webhook-signature` with it') });

const Attempt = z.object({ status_code: z.number().int().nullable(), latency_ms: z.number().int(), error: z.string().nullable(), created_at: Timestamp });
const Delivery = z
  .object({
    delivery_id: z.uuid().describe('The `webhook-id` header: the same on every attempt'),
    event_id: z.string(),
    event_type: z.string(),
    state: z.enum(['pending', 'succeeded', 'failed']),
    attempts: z.number().int(),
    next_attempt_at: Timestamp.nullable(),
    created_at: Timestamp,
    attempt_log: z.array(Attempt),
  })
  .meta({ id: 'WebhookDelivery' });

const endpointView = (row: EndpointRow) => ({
  ...row,
  webhook_id: row.id,
  secret_rotation_ends_at: row.previous_secret_sealed ? isoOrNull(row.previous_secret_expires_at) : null,
  created_at: iso(row.created_at),
  updated_at: iso(row.updated_at),
});

const deliveryView = (row: DeliveryRow, log: AttemptRow[]) => ({
  ...row,
  delivery_id: row.id,
  next_attempt_at: isoOrNull(row.next_attempt_at),
  created_at: iso(row.created_at),
  attempt_log: log.filter((a) => a.delivery_id === row.id).map((a) => ({ ...a, created_at: iso(a.created_at) })),
});

const EndpointBody = z.object({ url: Url, description: text(500).optional(), event_types: EventTypes.optional(), enabled: z.boolean().optional() });

export default [
  route({
    method: 'post',
    path: '/webhooks',
    summary: 'Subscribe a URL to account events (Standard Webhooks); answers the signing secret once',
    tags,
    access: 'auth',
    scope: 'webhooks:write',
    recentSignIn: true,
    body: EndpointBody,
    responses: { 201: { description: 'The endpoint and its secret', schema: WithSecret } },
    async handler({ c, user, body, meta }) {
      const { endpoint, secret } = await createEndpoint(c, user.id, body, meta);
      return { status: 201, body: { ...endpointView(endpoint), secret } };
    },
  }),

  route({
    method: 'get',
    path: '/webhooks',
    summary: "The account's webhook endpoints",
    tags,
    access: 'auth',
    scope: 'webhooks:write',
    query: PageQuery,
    responses: { 200: { description: 'A page of endpoints, newest first', schema: pageOf(Endpoint) } },
    async handler({ user, query, reader }) {
      const { items, total } = await listEndpoints(await reader(), user.id, { page: query.page, pageSize: query.page_size });
      return { body: { items: items.map(endpointView), page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'get',
    path: '/webhooks/{webhook_id}',
    summary: 'One webhook endpoint',
    tags,
    access: 'auth',
    scope: 'webhooks:write',
    params: Params,
    responses: { 200: { description: 'The endpoint', schema: Endpoint } },
    async handler({ c, user, params, meta }) {
      return { body: endpointView(await ownEndpoint(c, user.id, params.webhook_id, meta)) };
    },
  }),

  route({
    method: 'patch',
    path: '/webhooks/{webhook_id}',
    summary: 'Change a webhook endpoint: URL, description, event types, enabled',
    tags,
    access: 'auth',
    scope: 'webhooks:write',
    params: Params,
    body: EndpointBody.partial().refine((b) => Object.values(b).some((v) => v !== undefined), 'name at least one field to change'),
    // Pointing an endpoint somewhere else, or turning it on again (one a password reset paused), sends the
    // account's events there: as much a new credential as a new endpoint.
    recentSignIn: { when: (b) => b.url !== undefined || b.enabled === true, description: 'To change the URL or turn the endpoint on' },
    responses: { 200: { description: 'The endpoint', schema: Endpoint } },
    async handler({ c, user, params, body, meta }) {
      return { body: endpointView(await updateEndpoint(c, user.id, params.webhook_id, body, meta)) };
    },
  }),

  route({
    method: 'delete',
    path: '/webhooks/{webhook_id}',
    summary: 'Delete a webhook endpoint and its delivery records',
    tags,
    access: 'auth',
    scope: 'webhooks:write',
    params: Params,
    responses: { 204: { description: 'Deleted' } },
    async handler({ c, user, params, meta }) {
      await deleteEndpoint(c, user.id, params.webhook_id, meta);
      return { status: 204 };
    },
  }),

  route({
    method: 'post',
    path: '/webhooks/{webhook_id}/rotate-secret',
    summary: 'A new signing secret, answered once; the old one keeps signing beside it for a grace period',
    tags,
    access: 'auth',
    scope: 'webhooks:write',
    recentSignIn: true,
    params: Params,
    body: z.object({
      grace_hours: z.number().int().min(0).max(168).optional().describe('How long the old secret still signs (default WEBHOOK_SECRET_GRACE_HOURS, 24)'),
    }),
    responses: { 200: { description: 'The new secret', schema: z.object({ secret: z.string(), previous_secret_expires_at: Timestamp.nullable() }) } },
    async handler({ c, user, params, body, meta }) {
      const graceMs = body.grace_hours === undefined ? c.config.webhooks.secretGraceMs : body.grace_hours * 3600_000;
      const rotated = await rotateSecret(c, user.id, params.webhook_id, graceMs, meta);
      return { body: { secret: rotated.secret, previous_secret_expires_at: isoOrNull(rotated.previous_secret_expires_at) } };
    },
  }),

  route({
    method: 'post',
    path: '/webhooks/{webhook_id}/test',
    summary: 'Send a signed `webhook.test` event to the endpoint (even a disabled one); its outcome appears in the deliveries',
    tags,
    access: 'auth',
    scope: 'webhooks:write',
    params: Params,
    responses: { 202: { description: 'The queued delivery', schema: Delivery } },
    async handler({ c, user, params, meta }) {
      return { status: 202, body: deliveryView(await sendTestPing(c, user.id, params.webhook_id, meta), []) };
    },
  }),

  route({
    method: 'get',
    path: '/webhooks/{webhook_id}/deliveries',
    summary: "An endpoint's deliveries with their attempts (status, latency, error), newest first",
    tags,
    access: 'auth',
    scope: 'webhooks:write',
    params: Params,
    query: PageQuery.extend({ state: z.enum(['pending', 'succeeded', 'failed']).optional() }),
    responses: { 200: { description: 'A page of deliveries', schema: pageOf(Delivery) } },
    async handler({ c, user, params, query, meta, reader }) {
      const { items, total, attempts } = await listDeliveries(
        c,
        user.id,
        params.webhook_id,
        { state: query.state, page: query.page, pageSize: query.page_size },
        meta,
        await reader(),
      );
      return { body: { items: items.map((d) => deliveryView(d, attempts)), page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'get',
    path: '/webhooks/{webhook_id}/deliveries/{delivery_id}',
    summary: 'One delivery with its attempts',
    tags,
    access: 'auth',
    scope: 'webhooks:write',
    params: DeliveryParams,
    responses: { 200: { description: 'The delivery', schema: Delivery } },
    async handler({ c, user, params, meta }) {
      const row = await ownDelivery(c, user.id, params.webhook_id, params.delivery_id, meta);
      return { body: deliveryView(row, await deliveryAttempts(c, [row.id])) };
    },
  }),

  route({
    method: 'post',
    path: '/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver',
    summary: 'Send a finished delivery again (same webhook-id) with a fresh retry schedule',
    tags,
    access: 'auth',
    scope: 'webhooks:write',
    params: DeliveryParams,
    responses: { 202: { description: 'The delivery, pending again', schema: Delivery } },
    async handler({ c, user, params, meta }) {
      const row = await redeliver(c, user.id, params.webhook_id, params.delivery_id, meta);
      return { status: 202, body: deliveryView(row, await deliveryAttempts(c, [row.id])) };
    },
  }),
];
