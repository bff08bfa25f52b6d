import { z } from 'zod';
import { route } from '../../route';
import type { AppContext } from '../../context';
import { Timestamp, isoOrNull } from '../../schemas/common';
import { idempotencyKey } from '../../job-reply';
import { LIMIT_DESCRIPTIONS, LIMIT_NAMES, PLAN_IDS } from '../../../lib/billing/plans';
import { billingStatus, createCheckout, createPortal, receiveWebhook } from '../../../lib/billing/subscriptions';
import { AppError, badRequest, tooLarge } from '../../../lib/errors';

/**
 * Billing (SPEC.md "Billing"): status for any credential with `account:read`; checkout and portal need a
 * session (they manage the account's money); the provider's webhook is public and proves itself by its
 * signature over the raw body.
 */
const tags = ['Billing'];

const Limits = z
  .object(
    Object.fromEntries(LIMIT_NAMES.map((n) => [n, z.number().int().nullable().describe(`${LIMIT_DESCRIPTIONS[n]}; null: no plan limit`)])) as Record<
      (typeof LIMIT_NAMES)[number],
      z.ZodNullable<z.ZodNumber>
    >,
  )
  .meta({ id: 'PlanLimits' });

const Status = z
  .object({
    mode: z.enum(['disabled', 'test', 'live']).describe('disabled: no payment provider configured, every account on the default plan'),
    plan: z.enum(PLAN_IDS).describe('The plan whose limits apply now'),
    subscribed_plan: z
      .enum(PLAN_IDS)
      .describe('The plan the subscription buys (differs from `plan` once a past-due grace period has ended, or when the subscription is canceled)'),
    limits_enforced: z.boolean(),
    limits: Limits,
    usage: z.object({
      keys: z.number().int(),
      api_keys: z.number().int(),
      shares: z.number().int(),
      monthly_encrypted_bytes: z.number().int().describe('This month (UTC), including encrypt jobs still queued or running'),
      concurrent_jobs: z.number().int(),
      period: z.string().describe('`YYYY-MM` (UTC)'),
    }),
    provider_status: z.string().describe("The provider's subscription status (active, trialing, past_due, canceled, unpaid, ...) or `none`"),
    customer: z.boolean().describe('Whether the account has a customer at the provider'),
    subscription: z.object({
      status: z.string(),
      current_period_end: Timestamp.nullable(),
      cancel_at_period_end: z.boolean(),
      past_due_since: Timestamp.nullable(),
      grace_ends_at: Timestamp.nullable().describe('Past due: when the default plan’s limits take over'),
      synced_at: Timestamp.nullable().describe('When the subscription was last read from the provider'),
    }),
    plans: z.array(z.object({ plan_id: z.enum(PLAN_IDS), for_sale: z.boolean(), limits: Limits })),
  })
  .meta({ id: 'BillingStatus' });

/** Webhook bodies are small; this bounds what is read when the body was not parsed as JSON. */
const MAX_WEBHOOK_BYTES = 1024 * 1024;

/**
 * The exact bytes the provider signed. The app's JSON parser keeps them as `rawBody` (koa-body
 * `includeUnparsed`); a body it did not parse (another content type) is read here. A JSON body parsed
 * without its raw bytes cannot be verified: re-serialising it would not give the signed bytes.
 */
async function rawBody(ctx: AppContext): Promise<string | Buffer> {
  if (typeof ctx.request.rawBody === 'string') return ctx.request.rawBody;
  if (ctx.request.body !== undefined || ctx.req.readableEnded) {
    // Answered 5xx so the provider retries once the service is fixed; the cause is in the log (koa-body without includeUnparsed).
    ctx.state.log.error('billing webhook: the JSON body was parsed without its raw bytes (koa-body includeUnparsed is off); cannot verify');
    throw new AppError(500, 'raw_body_unavailable', 'The webhook could not be verified on our side; it was not stored.');
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of ctx.req) {
    size += (chunk as Buffer).length;
    if (size > MAX_WEBHOOK_BYTES) throw tooLarge('payload_too_large', 'The webhook body is larger than accepted.');
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

export default [
  route({
    method: 'get',
    path: '/billing/status',
    summary: 'Billing mode, plan, limits and usage, subscription state and period end, and the provider status',
    tags,
    access: 'auth',
    scope: 'account:read',
    responses: { 200: { description: 'Billing state of the account', schema: Status } },
    async handler({ c, user }) {
      const s = await billingStatus(c, user.id);
      return {
        body: {
          ...s,
          subscription: {
            ...s.subscription,
            current_period_end: isoOrNull(s.subscription.current_period_end),
            past_due_since: isoOrNull(s.subscription.past_due_since),
            grace_ends_at: isoOrNull(s.subscription.grace_ends_at),
            synced_at: isoOrNull(s.subscription.synced_at),
          },
        },
      };
    },
  }),

  route({
    method: 'post',
    path: '/billing/checkout',
    summary: 'Create a checkout session at the payment provider for a paid plan; answers its URL',
    tags,
    access: 'session',
    body: z.object({ plan: z.enum(PLAN_IDS).describe('A paid plan (the default plan cannot be bought)') }),
    responses: {
      201: {
        description: 'Send the user to `url`; the plan changes when the provider reports the payment (webhook)',
        schema: z.object({ url: z.string(), session_id: z.string(), plan: z.enum(PLAN_IDS), expires_at: Timestamp.nullable() }),
      },
    },
    async handler({ c, ctx, user, body, meta }) {
      const session = await createCheckout(c, user.id, body.plan, meta, idempotencyKey(ctx));
      return { status: 201, body: { ...session, expires_at: isoOrNull(session.expires_at) } };
    },
  }),

  route({
    method: 'get',
    path: '/billing/portal',
    summary: "Create a session of the provider's customer portal (payment methods, plan changes, cancellation); answers its URL",
    tags,
    access: 'session',
    responses: { 200: { description: 'Send the user to `url`', schema: z.object({ url: z.string() }) } },
    async handler({ c, user, meta }) {
      return { body: await createPortal(c, user.id, meta) };
    },
  }),

  route({
    method: 'post',
    path: '/billing/webhooks/stripe',
    summary:
      "The payment provider's webhook receiver: verified by its Stripe-Signature over the raw body, stored once by event id, processed by the billing queue",
    tags,
    access: 'public',
    responses: {
      200: {
        description: 'Stored (or already stored: `duplicate`)',
        schema: z.object({ received: z.literal(true), event_id: z.string(), duplicate: z.boolean() }),
      },
    },
    async handler({ c, ctx }) {
      const signature = ctx.get('stripe-signature') || undefined;
      if (!signature) throw badRequest('invalid_signature', 'The Stripe-Signature header is missing.');
      const result = await receiveWebhook(c, await rawBody(ctx), signature);
      return { body: { received: true, ...result } };
    },
  }),
];
