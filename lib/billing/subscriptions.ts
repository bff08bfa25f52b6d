import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import type { Container } from '../container';
import { badRequest, conflict, invalid, paymentRequired } from '../errors';
import { emitEvent } from '../events';
import { DEFAULT_PLAN, planForPrice, type LimitName, type Plan, type PlanId } from './plans';
import { callProvider, providerClient, verifyWebhook, type ProviderEvent, type ProviderSubscription } from './provider';
import { recordAudit, type AuditSource, type RequestMeta } from '../../db/audit';
import type { JobOrigin } from '../../jobs/define';
import type { JobKind } from '../../db/jobs';
import { findUserById, lockAccount } from '../../db/users';
import {
  accountUsage,
  findBillingAccount,
  findBillingEvent,
  lockBillingEvent,
  lockBillingAccountOfCustomer,
  markBillingEventProcessed,
  setBillingCustomer,
  unprocessedBillingEvents,
  updateSubscription,
  insertBillingEvent,
  lockBillingAccount,
  usagePeriod,
  type BillingAccountRow,
  type Usage,
} from '../../db/billing';
import type { AuditAction } from '../event-names';

/**
 * Billing: which plan an account is on (from its provider subscription, as last read from the provider),
 * the limits that plan sets (enforced by `enforcePlanLimit`, one helper every create path calls), checkout
 * and portal sessions at the provider, and inbound provider webhooks (verified, stored once, processed
 * by the `billing` queue).
 */

/** Subscription states in which the subscribed plan is in force (past_due: only during the grace period). */
const IN_FORCE = new Set(['active', 'trialing']);
const LIVE = new Set(['active', 'trialing', 'past_due', 'unpaid', 'incomplete', 'paused']);

export interface EffectivePlan {
  plan: Plan;
  /** The plan the subscription buys (the default plan without one). */
  subscribed: PlanId;
  /** When a past-due subscription's grace ends (then the default plan's limits apply); null otherwise. */
  graceEndsAt: Date | null;
}

/** The plan whose limits apply now: the subscribed one while active, trialing, or past due within the grace period. */
function effectivePlan(c: Container, account: BillingAccountRow | undefined, now: Date): EffectivePlan {
  const plans = c.config.billing.plans;
  const subscribed = (account && (plans as Record<string, Plan>)[account.plan]?.id) || DEFAULT_PLAN;
  if (!account || c.config.billing.mode === 'disabled') return { plan: plans[DEFAULT_PLAN], subscribed: DEFAULT_PLAN, graceEndsAt: null };
  if (IN_FORCE.has(account.status)) return { plan: plans[subscribed], subscribed, graceEndsAt: null };
  if (account.status === 'past_due') {
    const graceEndsAt = new Date((account.past_due_since ?? now).getTime() + c.config.billing.graceMs);
    return { plan: now < graceEndsAt ? plans[subscribed] : plans[DEFAULT_PLAN], subscribed, graceEndsAt };
  }
  return { plan: plans[DEFAULT_PLAN], subscribed, graceEndsAt: null };
}

// ---------------------------------------------------------------------------------------------------
// Limits

/**
 * THE plan limit check: 402 `plan_limit_reached` (naming the limit, its value and the usage) when
 * `amount` more of `limit` would pass the account's plan. Call it inside the transaction that inserts
 * the thing counted: it locks the account's user row first, so parallel requests of one account are
 * counted one after another and cannot pass the limit together. For `file_size`, `amount` is the size.
 * With limits not enforced (billing disabled, BILLING_ENFORCE_LIMITS unset) it does nothing.
 */
export function enforcePlanLimit(c: Container, trx: Knex.Transaction, userId: string, limit: LimitName, amount = 1): Promise<void> {
  return enforcePlanLimits(c, trx, userId, [{ limit, amount }]);
}

/** Several limits of one request, in order: one lock, one plan lookup, the usage counted at most once. */
async function enforcePlanLimits(c: Container, trx: Knex.Transaction, userId: string, checks: { limit: LimitName; amount: number }[]): Promise<void> {
  if (!c.config.billing.enforceLimits) return;
  // NO KEY UPDATE: serialises with other creations of the account, not with inserts that merely reference it.
  await lockAccount(trx, userId, 'no key update');
  const now = c.clock.now();
  const { plan } = effectivePlan(c, await findBillingAccount(trx, userId), now);
  let usageNow: Promise<Usage> | undefined;
  for (const { limit, amount } of checks) {
    const value = plan.limits[limit];
    if (value === null) continue;
    const usage = limit === 'file_size' ? 0 : (await (usageNow ??= accountUsage(trx, userId, now, c.config.jobLimits.timeoutMs)))[limit];
    const over = limit === 'file_size' ? amount > value : usage + amount > value;
    if (!over) continue;
    const what = limit === 'file_size' ? `a file of ${amount} bytes; files may have at most ${value}` : `${usage} of ${value} used, ${amount} more requested`;
    throw paymentRequired(
      'plan_limit_reached',
      `The ${plan.id} plan's limit on ${limit} is reached (${what}). Upgrade the plan (POST /billing/checkout) or free some up.`,
      {
        limit,
        limit_value: value,
        usage: limit === 'file_size' ? amount : usage,
        requested: amount,
        plan: plan.id,
      },
    );
  }
}

/** Whether a job of this kind is held to plan limits (file jobs, when limits are enforced at all). */
export const jobLimitsApply = (c: Container, kind: JobKind) => c.config.billing.enforceLimits && (kind === 'encrypt' || kind === 'decrypt');

/** A job submission's limits: file size, concurrent jobs, and (encryption) bytes this month, for file jobs only. */
export async function enforceJobLimits(c: Container, trx: Knex.Transaction, userId: string, kind: JobKind, fileSizes: number[]): Promise<void> {
  if (!jobLimitsApply(c, kind)) return;
  await enforcePlanLimits(c, trx, userId, [{ limit: 'concurrent_jobs', amount: 1 }, ...uploadChecks(kind, fileSizes)]);
}

/** The limits on a job's files, once their sizes are known (a job's upload ends after the job started). */
export async function enforceUploadLimits(c: Container, trx: Knex.Transaction, userId: string, kind: JobKind, fileSizes: number[]): Promise<void> {
  if (kind !== 'encrypt' && kind !== 'decrypt') return;
  await enforcePlanLimits(c, trx, userId, uploadChecks(kind, fileSizes));
}

function uploadChecks(kind: JobKind, fileSizes: number[]): { limit: LimitName; amount: number }[] {
  const checks: { limit: LimitName; amount: number }[] = [];
  if (fileSizes.length) checks.push({ limit: 'file_size', amount: Math.max(...fileSizes) });
  if (kind === 'encrypt') checks.push({ limit: 'monthly_encrypted_bytes', amount: fileSizes.reduce((n, s) => n + s, 0) });
  return checks;
}

// ---------------------------------------------------------------------------------------------------
// Status, checkout, portal

export async function billingStatus(c: Container, userId: string) {
  const now = c.clock.now();
  const account = await findBillingAccount(c.db, userId);
  const effective = effectivePlan(c, account, now);
  const usage: Usage = await accountUsage(c.db, userId, now, c.config.jobLimits.timeoutMs);
  return {
    mode: c.config.billing.mode,
    plan: effective.plan.id,
    subscribed_plan: effective.subscribed,
    limits_enforced: c.config.billing.enforceLimits,
    limits: effective.plan.limits,
    usage: { ...usage, period: usagePeriod(now) },
    provider_status: account?.status ?? 'none',
    customer: Boolean(account?.customer_id),
    subscription: {
      status: account?.status ?? 'none',
      current_period_end: account?.current_period_end ?? null,
      cancel_at_period_end: account?.cancel_at_period_end ?? false,
      past_due_since: account?.past_due_since ?? null,
      grace_ends_at: effective.graceEndsAt,
      synced_at: account?.synced_at ?? null,
    },
    plans: Object.values(c.config.billing.plans).map((p) => ({ plan_id: p.id, for_sale: Boolean(p.priceId), limits: p.limits })),
  };
}

const audit = (db: Knex, userId: string, action: AuditAction, target: string | null, from: AuditSource, details: Record<string, unknown> = {}) =>
  recordAudit(db, { user_id: userId, action, status: 'success', target, details }, from);

/**
 * The account's provider customer, created once: the billing row is locked while the provider is asked,
 * so parallel checkouts wait and then find it; the idempotency key (one per account) makes a retry after
 * a crash between the provider's answer and our commit get the same customer back.
 */
async function ensureCustomer(c: Container, userId: string, meta: RequestMeta): Promise<string> {
  const provider = await providerClient(c.config);
  return c.db.transaction(async (trx) => {
    const row = await lockBillingAccount(trx, userId, c.clock.now());
    if (row.customer_id) return row.customer_id;
    const user = await findUserById(trx, userId);
    const customer = await callProvider('create customer', () =>
      provider.customers.create({ email: user?.email, metadata: { user_id: userId } }, { idempotencyKey: `kms-customer-${userId}` }),
    );
    await setBillingCustomer(trx, userId, customer.id, c.clock.now());
    await audit(trx, userId, 'billing_customers.create', customer.id, meta);
    return customer.id;
  });
}

/**
 * A checkout session for a paid plan; answers its URL. `requestKey` (the client's Idempotency-Key) makes a
 * retried request get the same session from the provider; without it each request is a new session.
 */
export async function createCheckout(c: Container, userId: string, planId: PlanId, meta: RequestMeta, requestKey?: string) {
  const provider = await providerClient(c.config);
  const plan = c.config.billing.plans[planId];
  if (!plan.priceId)
    throw invalid(
      'plan_not_for_sale',
      `The ${planId} plan cannot be bought${planId === DEFAULT_PLAN ? ' (it is the default plan)' : ' (no provider price is configured for it)'}.`,
      [{ path: 'body.plan', message: 'not for sale' }],
    );
  const current = await findBillingAccount(c.db, userId);
  if (current?.subscription_id && LIVE.has(current.status)) {
    throw conflict('already_subscribed', 'The account already has a subscription; change or cancel it in the customer portal (GET /billing/portal).');
  }
  const customer = await ensureCustomer(c, userId, meta);
  const idempotencyKey = `kms-checkout-${userId}-${planId}-${requestKey ?? randomUUID()}`;
  const session = await callProvider('create checkout session', () =>
    provider.checkout.sessions.create(
      {
        mode: 'subscription',
        customer,
        client_reference_id: userId,
        line_items: [{ price: plan.priceId!, quantity: 1 }],
        success_url: c.config.billing.successUrl,
        cancel_url: c.config.billing.cancelUrl,
        metadata: { user_id: userId, plan: planId },
        subscription_data: { metadata: { user_id: userId, plan: planId } },
      },
      { idempotencyKey },
    ),
  );
  if (!session.url) throw new Error('payment provider: checkout session without a url');
  await audit(c.db, userId, 'billing_checkouts.create', session.id, meta, { plan: planId });
  return { url: session.url, session_id: session.id, plan: planId, expires_at: session.expires_at ? new Date(session.expires_at * 1000) : null };
}

/** A customer portal session (manage payment methods, change or cancel the plan); answers its URL. */
export async function createPortal(c: Container, userId: string, meta: RequestMeta) {
  const provider = await providerClient(c.config);
  const account = await findBillingAccount(c.db, userId);
  if (!account?.customer_id) throw conflict('no_billing_customer', 'The account has no billing customer yet; start with POST /billing/checkout.');
  const session = await callProvider('create portal session', () =>
    provider.billingPortal.sessions.create(
      { customer: account.customer_id!, return_url: c.config.billing.returnUrl },
      { idempotencyKey: `kms-portal-${userId}-${randomUUID()}` },
    ),
  );
  await audit(c.db, userId, 'billing_portals.open', session.id, meta);
  return { url: session.url };
}

// ---------------------------------------------------------------------------------------------------
// Webhooks

/** Event types that change an account's plan or status; others are stored and marked ignored. */
const HANDLED_EVENTS = new Set([
  'checkout.session.completed',
  'customer.subscription.created',
  'customer.subscription.updated',
  'customer.subscription.deleted',
  'invoice.paid',
  'invoice.payment_failed',
]);

const idOf = (v: unknown): string | null =>
  typeof v === 'string' ? v : v && typeof v === 'object' && typeof (v as { id?: unknown }).id === 'string' ? (v as { id: string }).id : null;

/** The ids an event names (its object, customer, subscription), whatever the object's kind. */
function eventIds(event: ProviderEvent): { object_id: string | null; customer_id: string | null; subscription_id: string | null } {
  const obj = event.data.object as unknown as Record<string, unknown>;
  const kind = obj.object;
  const parent = obj.parent as { subscription_details?: { subscription?: unknown } } | null | undefined;
  const subscription = kind === 'subscription' ? idOf(obj.id) : (idOf(obj.subscription) ?? idOf(parent?.subscription_details?.subscription));
  return { object_id: idOf(obj.id), customer_id: idOf(obj.customer), subscription_id: subscription };
}

/**
 * The inbound webhook: verified over the raw body, stored once by event id, queued, answered. A replay
 * of a stored event is answered the same (2xx), and queued again only if it was never processed (the
 * first enqueue may have failed); the processor itself does nothing for an event already processed.
 */
export async function receiveWebhook(c: Container, raw: string | Buffer, signature: string | undefined): Promise<{ event_id: string; duplicate: boolean }> {
  const event = await verifyWebhook(c.config, raw, signature, c.clock.now());
  // Every field stored is checked here: a signed event without one is the sender's error (400), not ours.
  if (!/^[A-Za-z0-9_]{1,255}$/.test(event.id) || typeof event.type !== 'string' || typeof event.created !== 'number' || typeof event.livemode !== 'boolean') {
    throw badRequest('malformed_event', 'The webhook body is not a provider event (it needs id, type, created and livemode).');
  }
  const ids = eventIds(event);
  const stored = await insertBillingEvent(c.db, {
    id: event.id,
    type: event.type,
    livemode: event.livemode,
    provider_created_at: new Date(event.created * 1000),
    ...ids,
    received_at: c.clock.now(),
  });
  const row = stored ? undefined : await findBillingEvent(c.db, event.id);
  if (stored || !row?.processed_at) await c.jobs.enqueue('billing-event', { event_id: event.id }, { jobId: `billing-${event.id}` });
  return { event_id: event.id, duplicate: !stored };
}

/** Queues stored events still unprocessed after `olderThanMs` (at most 500 per run); a queued one is not doubled (job id). */
export async function requeueUnprocessedEvents(c: Container, olderThanMs: number): Promise<number> {
  const before = new Date(c.clock.now().getTime() - olderThanMs);
  const ids = await unprocessedBillingEvents(c.db, before, 500);
  for (const id of ids) {
    // A failed job kept under the id would make the enqueue a no-op: it goes first.
    const stale = await c.jobs.queue('billing').getJob(`billing-${id}`);
    if (stale && (await stale.isFailed())) await stale.remove();
    await c.jobs.enqueue('billing-event', { event_id: id }, { jobId: `billing-${id}` });
  }
  return ids.length;
}

interface SubscriptionState {
  subscription_id: string;
  plan: PlanId;
  status: string;
  current_period_end: Date | null;
  cancel_at_period_end: boolean;
}

function subscriptionState(c: Container, sub: ProviderSubscription): SubscriptionState {
  const item = sub.items?.data?.[0];
  const plan = planForPrice(c.config.billing.plans, item?.price?.id);
  if (!plan) c.log.warn({ subscription_id: sub.id, price: item?.price?.id }, 'billing: subscription to a price no plan names; treated as the default plan');
  const periodEnd = item?.current_period_end ?? (sub as unknown as { current_period_end?: number }).current_period_end;
  return {
    subscription_id: sub.id,
    plan: plan?.id ?? DEFAULT_PLAN,
    status: sub.status,
    current_period_end: periodEnd ? new Date(periodEnd * 1000) : null,
    cancel_at_period_end: sub.cancel_at_period_end,
  };
}

type EventOutcome =
  'applied' | 'unchanged' | 'ignored_type' | 'ignored_no_subscription' | 'ignored_unknown_customer' | 'ignored_mode' | 'ignored_other_subscription';

/**
 * Processes one stored event (the `billing-event` job). Order and replays do not matter: the event only
 * says WHICH subscription changed; its state is re-read from the provider, so a late or repeated event
 * applies the provider's current state, never its own stale copy. The event row is locked and checked
 * in the transaction that applies the change, audits it and marks the event processed: a crash at any
 * point leaves the event unprocessed (to run again) or processed with its effect, never the effect twice.
 * The outcome is an EventOutcome, `missing`, or, for an event processed before, the one stored then.
 */
export async function processBillingEvent(c: Container, eventId: string, origin: JobOrigin): Promise<{ outcome: string }> {
  const event = await findBillingEvent(c.db, eventId);
  if (!event) return { outcome: 'missing' };
  if (event.processed_at) return { outcome: event.outcome ?? 'processed' };
  let outcome: EventOutcome | null = null;
  if (!HANDLED_EVENTS.has(event.type)) outcome = 'ignored_type';
  else if (event.livemode !== (c.config.billing.mode === 'live')) outcome = 'ignored_mode';
  else if (!event.subscription_id) outcome = 'ignored_no_subscription';
  // Read outside the transaction: no row lock is held while the provider answers.
  const sub = outcome
    ? null
    : subscriptionState(
        c,
        await callProvider('retrieve subscription', async () => (await providerClient(c.config)).subscriptions.retrieve(event.subscription_id!)),
      );

  const done = await c.db.transaction(async (trx) => {
    const locked = await lockBillingEvent(trx, eventId);
    if (!locked || locked.processed_at) return null; // another worker finished it meanwhile
    const now = c.clock.now();
    const finish = async (result: EventOutcome, userId: string | null = null) => {
      await markBillingEventProcessed(trx, eventId, { processed_at: now, outcome: result, user_id: userId });
      return { outcome: result, userId, change: null as null | { from: PlanId; to: PlanId; fromStatus: string; status: string } };
    };
    if (outcome || !sub) return finish(outcome ?? 'ignored_no_subscription');
    const account = event.customer_id ? await lockBillingAccountOfCustomer(trx, event.customer_id) : undefined;
    if (!account) return finish('ignored_unknown_customer');
    // A late event about an old subscription must not replace a newer live one.
    if (account.subscription_id && account.subscription_id !== sub.subscription_id && LIVE.has(account.status) && !LIVE.has(sub.status)) {
      return finish('ignored_other_subscription', account.user_id);
    }
    const before = effectivePlan(c, account, now);
    const pastDueSince = sub.status === 'past_due' ? (account.status === 'past_due' && account.past_due_since ? account.past_due_since : now) : null;
    const after = await updateSubscription(trx, account.user_id, { ...sub, past_due_since: pastDueSince, synced_at: now, updated_at: now });
    const effective = effectivePlan(c, after, now);
    const changed = before.subscribed !== effective.subscribed || before.plan.id !== effective.plan.id;
    const statusChanged = account.status !== sub.status;
    const details = {
      event_id: eventId,
      event_type: event.type,
      subscription_id: sub.subscription_id,
      from_plan: before.plan.id,
      to_plan: effective.plan.id,
      subscribed_plan: sub.plan,
      from_status: account.status,
      status: sub.status,
    };
    if (changed) await audit(trx, account.user_id, 'billing_plans.change', sub.subscription_id, origin, details);
    else if (statusChanged) await audit(trx, account.user_id, 'billing_subscriptions.change_status', sub.subscription_id, origin, details);
    if (event.type === 'invoice.payment_failed') {
      await audit(trx, account.user_id, 'billing_payments.fail', event.object_id, origin, {
        event_id: eventId,
        subscription_id: sub.subscription_id,
        status: sub.status,
      });
    }
    const result = await finish(changed || statusChanged ? 'applied' : 'unchanged', account.user_id);
    return { ...result, change: changed ? { from: before.plan.id, to: effective.plan.id, fromStatus: account.status, status: sub.status } : null };
  });
  if (!done) return { outcome: 'processed' };
  // Events after the commit: published once, since only the run that marked the event processed gets here.
  if (done.userId && done.change) {
    await emitEvent(c, done.userId, 'billing_plans.changed', {
      from_plan: done.change.from,
      to_plan: done.change.to,
      status: done.change.status,
      subscription_id: event.subscription_id,
    });
  }
  if (done.userId && event.type === 'invoice.payment_failed') {
    await emitEvent(c, done.userId, 'billing_payments.failed', { invoice_id: event.object_id, subscription_id: event.subscription_id });
  }
  return { outcome: done.outcome };
}
