import { z } from 'zod';
import { route } from '../../route';
import { Timestamp, isoOrNull } from '../../schemas/common';
import { idempotencyKey } from '../../job-reply';
import { LIMIT_DESCRIPTIONS, LIMIT_NAMES, PLAN_IDS } from '../../../lib/billing/plans';
import { billingStatus, createCheckout, createPortal } from '../../../lib/billing/subscriptions';

/**
 * Billing (SPEC.md "Billing"): status for any credential with `account:read`; checkout and portal need a
 * session (they manage the account's money). The provider's webhook: provider-webhook.ts.
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
];
