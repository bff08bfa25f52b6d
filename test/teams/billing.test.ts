import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import Stripe from 'stripe';
import { registerUser, startTestService, type ApiResponse, type ManualClockFollowingTime, type TestService } from '../support/service';
import { createKey, waitJob } from '../support/keys';
import { startProcess, waitForOutput } from '../support/process';
import { startStripeServer, type StripeServer } from '../support/stripe-server';
import { loadConfig } from '../../lib/config';
import { eventHistory } from '../../lib/event-stream';

/**
 * Billing against a local stand-in for the payment provider's API (the real `stripe` SDK pointed at it),
 * with webhooks signed by the SDK's own test helper.
 */
const WEBHOOK_SECRET = `whsec_${randomBytes(24).toString('base64')}`;
const PRICES = { pro: 'price_pro_test', business: 'price_business_test' };
const FREE = { keys: 2, api_keys: 1, shares: 1, monthly_encrypted_bytes: 3000, concurrent_jobs: 1, file_size: 2000 };
const GRACE_DAYS = 3;

let stripe: StripeServer;
let s: TestService;

const billingEnv = (server: StripeServer) => ({
  STRIPE_SECRET_KEY: `sk_test_${randomBytes(12).toString('hex')}`,
  STRIPE_WEBHOOK_SECRET: WEBHOOK_SECRET,
  STRIPE_API_URL: server.url,
  STRIPE_PRICE_PRO: PRICES.pro,
  STRIPE_PRICE_BUSINESS: PRICES.business,
  BILLING_PLANS: JSON.stringify({ free: FREE }),
  BILLING_GRACE_DAYS: String(GRACE_DAYS),
});

beforeAll(async () => {
  stripe = await startStripeServer({ latencyMs: 30 });
  s = await startTestService({ env: billingEnv(stripe) });
});
afterAll(async () => {
  await s?.stop();
  await stripe?.close();
});

let seq = 0;
/** A provider event as the provider sends it (pretty-printed JSON, as Stripe does), signed. */
function signedEvent(
  type: string,
  object: Record<string, unknown>,
  opts: { created?: number; id?: string; timestamp?: number; secret?: string; without?: string } = {},
) {
  const event: Record<string, unknown> & { id: string } = {
    id: opts.id ?? `evt_${randomBytes(10).toString('hex')}${seq++}`,
    object: 'event',
    api_version: '2026-10-28',
    created: opts.created ?? Math.floor(Date.now() / 1000),
    livemode: false,
    pending_webhooks: 1,
    request: { id: null, idempotency_key: null },
    type,
    data: { object },
  };
  if (opts.without) delete event[opts.without];
  const payload = JSON.stringify(event, null, 2);
  const header = Stripe.webhooks.generateTestHeaderString({ payload, secret: opts.secret ?? WEBHOOK_SECRET, timestamp: opts.timestamp });
  return { event, payload, header };
}

const post = (server: TestService, e: { payload: string; header: string }, headers: Record<string, string> = {}) =>
  server.api('POST', '/billing/webhooks/stripe', {
    raw: e.payload,
    headers: { 'content-type': 'application/json; charset=utf-8', 'stripe-signature': e.header, ...headers },
  });

const status = async (server: TestService, token: string) => {
  const res = await server.api('GET', '/billing/status', { token });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
};

/** A user with a provider customer (made by a checkout), ready to receive subscription events. */
async function customerFor(server: TestService) {
  const u = await registerUser(server.api);
  const res = await server.api('POST', '/billing/checkout', { token: u.token, body: { plan: 'pro' } });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  const row = await server.c.db('billing_accounts').where({ user_id: u.id }).first();
  return { ...u, customer: row.customer_id as string };
}

const processed = (server: TestService, id: string) =>
  expect.poll(async () => (await server.c.db('billing_events').where({ id }).first())?.processed_at ?? null, { timeout: 15_000, interval: 50 }).not.toBeNull();

const auditRows = (server: TestService, userId: string, action: string) => server.c.db('audit_logs').where({ user_id: userId, action });

describe('configuration', () => {
  const base = { NODE_ENV: 'test' };
  it('derives the mode from the key prefix and refuses a live key in development and test', () => {
    expect(loadConfig(base).billing.mode).toBe('disabled');
    expect(loadConfig(base).billing.enforceLimits).toBe(false);
    expect(loadConfig({ ...base, STRIPE_SECRET_KEY: 'sk_test_abc', STRIPE_WEBHOOK_SECRET: 'whsec_x' }).billing).toMatchObject({
      mode: 'test',
      enforceLimits: true,
    });
    for (const env of ['development', 'test']) {
      expect(() => loadConfig({ NODE_ENV: env, STRIPE_SECRET_KEY: 'sk_live_abc', STRIPE_WEBHOOK_SECRET: 'whsec_x' })).toThrow(
        /live key.*not allowed with NODE_ENV=/,
      );
      expect(() => loadConfig({ NODE_ENV: env, STRIPE_SECRET_KEY: 'rk_live_abc', STRIPE_WEBHOOK_SECRET: 'whsec_x' })).toThrow(/live key/);
    }
    const prod = { MASTER_KEY: `k1:${randomBytes(32).toString('base64')}`, JWT_SECRET: randomBytes(24).toString('hex') };
    expect(loadConfig({ ...prod, STRIPE_SECRET_KEY: 'sk_live_abc', STRIPE_WEBHOOK_SECRET: 'whsec_x' }).billing.mode).toBe('live');
    expect(() => loadConfig({ ...prod, STRIPE_SECRET_KEY: 'sk_live_abc', STRIPE_WEBHOOK_SECRET: 'whsec_x', STRIPE_API_URL: 'http://127.0.0.1:1' })).toThrow(
      /https/,
    );
  });

  it('refuses unknown key prefixes, a missing webhook secret, bad plan overrides and one price for two plans', () => {
    expect(() => loadConfig({ NODE_ENV: 'test', STRIPE_SECRET_KEY: 'pk_test_abc', STRIPE_WEBHOOK_SECRET: 'whsec_x' })).toThrow(/must start with sk_test_/);
    expect(() => loadConfig({ NODE_ENV: 'test', STRIPE_SECRET_KEY: 'sk_test_abc' })).toThrow(/STRIPE_WEBHOOK_SECRET must be set/);
    expect(() => loadConfig({ NODE_ENV: 'test', BILLING_PLANS: '{"free":{"keyz":1}}' })).toThrow(/BILLING_PLANS/);
    expect(() => loadConfig({ NODE_ENV: 'test', BILLING_PLANS: 'not json' })).toThrow(/BILLING_PLANS must be JSON/);
    expect(() => loadConfig({ NODE_ENV: 'test', STRIPE_PRICE_PRO: 'price_1', STRIPE_PRICE_BUSINESS: 'price_1' })).toThrow(/same price/);
    const plans = loadConfig({ NODE_ENV: 'test', STRIPE_PRICE_PRO: 'price_1', BILLING_PLANS: '{"pro":{"keys":null}}' }).billing.plans;
    expect(plans.pro).toMatchObject({ priceId: 'price_1', limits: { keys: null } });
    expect(plans.business.priceId).toBeNull();
    expect(plans.free.priceId).toBeNull();
  });
});

describe('billing disabled (no provider key)', () => {
  it('keeps every account on the default plan, answers 409 billing_disabled, and enforces no plan limit', async () => {
    const d = await startTestService({ roles: ['web'] });
    try {
      const u = await registerUser(d.api);
      const st = await status(d, u.token);
      expect(st).toMatchObject({ mode: 'disabled', plan: 'free', subscribed_plan: 'free', limits_enforced: false, provider_status: 'none', customer: false });
      for (const [method, path, body] of [
        ['POST', '/billing/checkout', { plan: 'pro' }],
        ['GET', '/billing/portal', undefined],
      ] as const) {
        const res = await d.api(method, path, { token: u.token, body });
        expect(res.status, path).toBe(409);
        expect(res.body).toMatchObject({ code: 'billing_disabled', status: 409 });
        expect(res.headers.get('content-type')).toContain('application/problem+json');
      }
      const hook = await post(d, signedEvent('customer.subscription.updated', { id: 'sub_x', object: 'subscription', customer: 'cus_x' }));
      expect(hook.status).toBe(409);
      expect(await d.c.db('billing_events')).toHaveLength(0);
      // More keys than the free plan of the billing tests allows (limits are off without billing).
      for (let i = 0; i < FREE.keys + 1; i++)
        await d.api('POST', '/keys', { token: u.token, body: { label: `k${i}` } }).then((r) => expect(r.status).toBe(201));
    } finally {
      await d.stop();
    }
  }, 60_000);
});

describe('checkout and portal against the provider', () => {
  it('creates the provider customer once under parallel checkouts, with an idempotency key on every call', async () => {
    const u = await registerUser(s.api);
    const before = stripe.requests.length;
    const results = await Promise.all(Array.from({ length: 5 }, () => s.api('POST', '/billing/checkout', { token: u.token, body: { plan: 'pro' } })));
    for (const r of results) {
      expect(r.status, JSON.stringify(r.body)).toBe(201);
      expect(r.body.url).toMatch(/^https:\/\/checkout\.stripe\.test\/c\/pay\/cs_test_/);
      expect(r.body.plan).toBe('pro');
    }
    const mine = stripe.requests.slice(before);
    const creates = mine.filter((r) => r.path === '/v1/customers');
    expect(creates).toHaveLength(1);
    expect(creates[0].form).toMatchObject({ email: u.email, 'metadata[user_id]': u.id });
    const account = await s.c.db('billing_accounts').where({ user_id: u.id }).first();
    expect(account.customer_id).toMatch(/^cus_/);
    const sessions = mine.filter((r) => r.path === '/v1/checkout/sessions');
    expect(sessions).toHaveLength(5);
    for (const r of sessions) {
      expect(r.form).toMatchObject({
        mode: 'subscription',
        customer: account.customer_id,
        client_reference_id: u.id,
        'line_items[0][price]': PRICES.pro,
        'line_items[0][quantity]': '1',
      });
    }
    for (const r of mine) {
      expect(r.method).toBe('POST');
      expect(r.idempotencyKey, r.path).toMatch(/^kms-/);
      expect(r.authorization).toMatch(/^Bearer sk_test_/);
    }
    expect(new Set(sessions.map((r) => r.idempotencyKey)).size).toBe(5);
    expect(await auditRows(s, u.id, 'billing_customers.create')).toHaveLength(1);
    expect(await auditRows(s, u.id, 'billing_checkouts.create')).toHaveLength(5);
    // The client's Idempotency-Key makes a retried checkout the same provider session.
    const again = await Promise.all(
      [1, 2].map(() => s.api('POST', '/billing/checkout', { token: u.token, body: { plan: 'business' }, headers: { 'idempotency-key': 'retry-1' } })),
    );
    expect(again[0].body.session_id).toBe(again[1].body.session_id);
    expect(stripe.requests.filter((r) => r.path === '/v1/customers').filter((r) => r.form['metadata[user_id]'] === u.id)).toHaveLength(1);
  });

  it('answers a portal URL for an account with a customer, and refuses without one', async () => {
    const fresh = await registerUser(s.api);
    const none = await s.api('GET', '/billing/portal', { token: fresh.token });
    expect(none.status).toBe(409);
    expect(none.body.code).toBe('no_billing_customer');

    const u = await customerFor(s);
    const before = stripe.requests.length;
    const portal = await s.api('GET', '/billing/portal', { token: u.token });
    expect(portal.status, JSON.stringify(portal.body)).toBe(200);
    expect(portal.body.url).toMatch(/^https:\/\/billing\.stripe\.test\/p\/session\/bps_/);
    const [req] = stripe.requests.slice(before);
    expect(req).toMatchObject({
      method: 'POST',
      path: '/v1/billing_portal/sessions',
      form: { customer: u.customer, return_url: expect.stringContaining('/team') },
    });
    expect(req.idempotencyKey).toMatch(/^kms-portal-/);
    expect(await auditRows(s, u.id, 'billing_portals.open')).toHaveLength(1);
  });

  it('needs a session for checkout and portal, refuses the default plan and unknown plans', async () => {
    const u = await registerUser(s.api);
    for (const [method, path] of [
      ['POST', '/billing/checkout'],
      ['GET', '/billing/portal'],
    ] as const) {
      const res = await s.api(method, path, { token: u.apiKey, body: method === 'POST' ? { plan: 'pro' } : undefined });
      expect(res.status, path).toBe(403);
      expect(res.body.code).toBe('session_required');
      expect((await s.api(method, path, { body: method === 'POST' ? { plan: 'pro' } : undefined })).status).toBe(401);
    }
    const free = await s.api('POST', '/billing/checkout', { token: u.token, body: { plan: 'free' } });
    expect(free.status).toBe(422);
    expect(free.body.code).toBe('plan_not_for_sale');
    expect((await s.api('POST', '/billing/checkout', { token: u.token, body: { plan: 'gold' } })).status).toBe(422);
    // Status is readable with the partner key (every scope).
    expect((await s.api('GET', '/billing/status', { token: u.apiKey })).status).toBe(200);
  });

  it('answers 503 when the provider fails (its text not passed on), and sends a live subscription to the portal', async () => {
    const gone = await customerFor(s);
    stripe.customers.delete(gone.customer); // the provider now answers 404 for this customer
    const failed = await s.api('POST', '/billing/checkout', { token: gone.token, body: { plan: 'pro' } });
    expect(failed.status).toBe(503);
    expect(failed.body.code).toBe('provider_unavailable');
    expect(JSON.stringify(failed.body)).not.toContain(gone.customer);

    const u = await customerFor(s);
    const sub = stripe.setSubscription({ id: `sub_${randomBytes(6).toString('hex')}`, customer: u.customer, price: PRICES.pro, status: 'active' });
    const e = signedEvent('customer.subscription.created', sub);
    expect((await post(s, e)).status).toBe(200);
    await processed(s, e.event.id);
    const res = await s.api('POST', '/billing/checkout', { token: u.token, body: { plan: 'business' } });
    expect(res.status).toBe(409);
    expect(res.body.code).toBe('already_subscribed');
  });
});

describe('verified webhooks', () => {
  it('a signed subscription event changes the plan: status, audit row and billing_plans.change event', async () => {
    const u = await customerFor(s);
    expect((await status(s, u.token)).plan).toBe('free');
    const sub = stripe.setSubscription({ id: `sub_${randomBytes(6).toString('hex')}`, customer: u.customer, price: PRICES.pro, status: 'active' });
    const e = signedEvent('customer.subscription.created', sub);
    const res = await post(s, e);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toEqual({ received: true, event_id: e.event.id, duplicate: false });
    await processed(s, e.event.id);
    const st = await status(s, u.token);
    expect(st).toMatchObject({ mode: 'test', plan: 'pro', subscribed_plan: 'pro', provider_status: 'active', customer: true, limits_enforced: true });
    expect(st.limits.keys).toBe(100);
    expect(new Date(st.subscription.current_period_end).getTime()).toBe(sub.items.data[0].current_period_end * 1000);
    const audits = await auditRows(s, u.id, 'billing_plans.change');
    expect(audits).toHaveLength(1);
    expect(audits[0].details).toMatchObject({ from_plan: 'free', to_plan: 'pro', event_id: e.event.id, status: 'active' });
    // The event is emitted after the commit that marks the provider event processed: it may come a moment later.
    const planChanged = () => eventHistory(s.c.redis, s.config.redisPrefix, u.id, { types: ['billing_plans.changed'] });
    await expect.poll(async () => (await planChanged()).length, { timeout: 10_000 }).toBe(1);
    const events = await planChanged();
    expect(events[0].data).toMatchObject({ from_plan: 'free', to_plan: 'pro', subscription_id: sub.id });
    expect(JSON.stringify(events[0].data)).not.toContain(WEBHOOK_SECRET);
  });

  it('refuses a bad signature, another secret, a changed body, a stale or future timestamp and no header: 400, nothing stored', async () => {
    const u = await customerFor(s);
    const sub = { id: 'sub_forged', object: 'subscription', customer: u.customer };
    const now = Math.floor(Date.now() / 1000);
    const good = signedEvent('customer.subscription.updated', sub);
    const cases = [
      { name: 'other secret', e: signedEvent('customer.subscription.updated', sub, { secret: `whsec_${randomBytes(24).toString('base64')}` }) },
      { name: 'changed body', e: { ...good, payload: good.payload.replace('sub_forged', 'sub_forgeD') } },
      { name: 'stale', e: signedEvent('customer.subscription.updated', sub, { timestamp: now - 600 }) },
      { name: 'future', e: signedEvent('customer.subscription.updated', sub, { timestamp: now + 600 }) },
      { name: 'garbage header', e: { ...good, header: 't=1,v1=abc' } },
    ];
    for (const { name, e } of cases) {
      const res = await post(s, e);
      expect(res.status, name).toBe(400);
      expect(res.body.code, name).toBe('invalid_signature');
      expect(await s.c.db('billing_events').where({ id: e.event.id }).first(), name).toBeUndefined();
    }
    const noHeader = await s.api('POST', '/billing/webhooks/stripe', { raw: good.payload, headers: { 'content-type': 'application/json' } });
    expect(noHeader.status).toBe(400);
    expect(await s.c.db('billing_events').where({ id: good.event.id }).first()).toBeUndefined();
    // The service clock decides staleness: the good one, delivered 10 minutes "later", is stale too.
    (s.c.clock as ManualClockFollowingTime).advance(600_000);
    try {
      expect((await post(s, good)).status).toBe(400);
    } finally {
      (s.c.clock as ManualClockFollowingTime).advance(-600_000);
    }
    expect(await s.c.db('billing_events').where({ id: good.event.id }).first()).toBeUndefined();
  });

  it('refuses a signed event without one of the fields it stores: 400 malformed_event, nothing stored', async () => {
    for (const field of ['livemode', 'created', 'type']) {
      const e = signedEvent('customer.subscription.updated', { id: 'sub_x', object: 'subscription' }, { without: field });
      const res = await post(s, e);
      expect(res.status, `${field}: ${JSON.stringify(res.body)}`).toBe(400);
      expect(res.body.code).toBe('malformed_event');
      expect(await s.c.db('billing_events').where({ id: e.event.id }).first()).toBeUndefined();
    }
  });

  it('stores a replayed event id once and applies it once', async () => {
    const u = await customerFor(s);
    const sub = stripe.setSubscription({ id: `sub_${randomBytes(6).toString('hex')}`, customer: u.customer, price: PRICES.business, status: 'active' });
    const e = signedEvent('customer.subscription.created', sub);
    const first = await post(s, e);
    expect(first.body.duplicate).toBe(false);
    await processed(s, e.event.id);
    const replays = await Promise.all([1, 2, 3].map(() => post(s, e)));
    for (const r of replays) expect(r.body).toEqual({ received: true, event_id: e.event.id, duplicate: true });
    expect(await s.c.db('billing_events').where({ id: e.event.id })).toHaveLength(1);
    await new Promise((r) => setTimeout(r, 300));
    expect(await auditRows(s, u.id, 'billing_plans.change')).toHaveLength(1);
    expect(await eventHistory(s.c.redis, s.config.redisPrefix, u.id, { types: ['billing_plans.changed'] })).toHaveLength(1);
    expect((await status(s, u.token)).plan).toBe('business');
  });

  it('events out of order leave the provider’s current state (the subscription is re-read, never taken from the event)', async () => {
    const u = await customerFor(s);
    const id = `sub_${randomBytes(6).toString('hex')}`;
    const t0 = Math.floor(Date.now() / 1000) - 100;
    const created = { id, object: 'subscription', customer: u.customer, status: 'active', items: { data: [{ price: { id: PRICES.pro } }] } };
    // The provider's state now: upgraded to business. The update arrives first, the older creation after it.
    stripe.setSubscription({ id, customer: u.customer, price: PRICES.business, status: 'active', created: t0 });
    const updated = signedEvent('customer.subscription.updated', { ...created, items: { data: [{ price: { id: PRICES.business } }] } }, { created: t0 + 50 });
    const older = signedEvent('customer.subscription.created', created, { created: t0 });
    await post(s, updated);
    await processed(s, updated.event.id);
    await post(s, older);
    await processed(s, older.event.id);
    expect((await status(s, u.token)).plan).toBe('business');
    expect((await s.c.db('billing_events').where({ id: older.event.id }).first()).outcome).toBe('unchanged');

    // Canceled at the provider; a late "updated" (active, business) arrives after the deletion.
    stripe.setSubscription({ id, customer: u.customer, price: PRICES.business, status: 'canceled', created: t0 });
    const deleted = signedEvent('customer.subscription.deleted', { ...created, status: 'canceled' }, { created: t0 + 90 });
    const late = signedEvent('customer.subscription.updated', { ...created, status: 'active' }, { created: t0 + 60 });
    await post(s, deleted);
    await processed(s, deleted.event.id);
    await post(s, late);
    await processed(s, late.event.id);
    const st = await status(s, u.token);
    expect(st).toMatchObject({ plan: 'free', provider_status: 'canceled' });
    const changes = (await auditRows(s, u.id, 'billing_plans.change').orderBy('id')).map((r: { details: { to_plan: string } }) => r.details.to_plan);
    expect(changes).toEqual(['business', 'free']);
  });

  it('past due keeps the plan for the grace period, then the free limits apply without deleting anything', async () => {
    const u = await customerFor(s);
    const id = `sub_${randomBytes(6).toString('hex')}`;
    stripe.setSubscription({ id, customer: u.customer, price: PRICES.pro, status: 'active' });
    const start = signedEvent('checkout.session.completed', {
      id: 'cs_test_done',
      object: 'checkout.session',
      customer: u.customer,
      subscription: id,
      client_reference_id: u.id,
      mode: 'subscription',
    });
    await post(s, start);
    await processed(s, start.event.id);
    expect((await status(s, u.token)).plan).toBe('pro');
    for (let i = 0; i < FREE.keys + 1; i++) await createKey(s.api, u.token, { label: `pd${i}` });

    stripe.setSubscription({ id, customer: u.customer, price: PRICES.pro, status: 'past_due' });
    const failed = signedEvent('invoice.payment_failed', {
      id: 'in_failed1',
      object: 'invoice',
      customer: u.customer,
      parent: { type: 'subscription_details', subscription_details: { subscription: id } },
    });
    await post(s, failed);
    await processed(s, failed.event.id);
    let st = await status(s, u.token);
    expect(st).toMatchObject({ plan: 'pro', subscribed_plan: 'pro', provider_status: 'past_due' });
    const graceEnds = new Date(st.subscription.grace_ends_at).getTime();
    expect(graceEnds - new Date(st.subscription.past_due_since).getTime()).toBe(GRACE_DAYS * 86_400_000);
    expect(await auditRows(s, u.id, 'billing_payments.fail')).toHaveLength(1);
    const pf = await eventHistory(s.c.redis, s.config.redisPrefix, u.id, { types: ['billing_payments.failed'] });
    expect(pf).toHaveLength(1);
    expect(pf[0].data).toMatchObject({ invoice_id: 'in_failed1', subscription_id: id });
    expect((await s.api('POST', '/keys', { token: u.token, body: { label: 'in-grace' } })).status).toBe(201);

    const clock = s.c.clock as ManualClockFollowingTime;
    // Sessions last an hour: past the grace period the partner key (90 days) speaks for the account.
    clock.advance(GRACE_DAYS * 86_400_000 + 60_000);
    try {
      st = await status(s, u.apiKey);
      expect(st).toMatchObject({ plan: 'free', subscribed_plan: 'pro', provider_status: 'past_due' });
      const refused = await s.api('POST', '/keys', { token: u.apiKey, body: { label: 'after-grace' } });
      expect(refused.status).toBe(402);
      expect(refused.body).toMatchObject({ code: 'plan_limit_reached', limit: 'keys', limit_value: FREE.keys, usage: FREE.keys + 2, plan: 'free' });
      // Nothing was deleted: every key is still listed and usable.
      expect((await s.api('GET', '/keys/list', { token: u.apiKey })).body.total).toBe(FREE.keys + 2);

      // Paid: back to the plan, at once.
      stripe.setSubscription({ id, customer: u.customer, price: PRICES.pro, status: 'active' });
      const paid = signedEvent(
        'invoice.paid',
        { id: 'in_paid1', object: 'invoice', customer: u.customer, subscription: id },
        { timestamp: Math.floor(clock.now().getTime() / 1000) },
      );
      expect((await post(s, paid)).status).toBe(200);
      await processed(s, paid.event.id);
      st = await status(s, u.apiKey);
      expect(st).toMatchObject({ plan: 'pro', provider_status: 'active', subscription: { past_due_since: null, grace_ends_at: null } });
      expect((await s.api('POST', '/keys', { token: u.apiKey, body: { label: 'paid-again' } })).status).toBe(201);
    } finally {
      clock.advance(-(GRACE_DAYS * 86_400_000 + 60_000));
    }
  });

  it('ignores events for unknown customers and types it does not handle, once', async () => {
    const unknown = signedEvent('customer.subscription.updated', { id: 'sub_nobody', object: 'subscription', customer: 'cus_nobody' });
    stripe.setSubscription({ id: 'sub_nobody', customer: 'cus_nobody', price: PRICES.pro, status: 'active' });
    const other = signedEvent('charge.refunded', { id: 'ch_1', object: 'charge', customer: 'cus_nobody' });
    for (const e of [unknown, other]) expect((await post(s, e)).status).toBe(200);
    await processed(s, unknown.event.id);
    await processed(s, other.event.id);
    expect((await s.c.db('billing_events').where({ id: unknown.event.id }).first()).outcome).toBe('ignored_unknown_customer');
    expect((await s.c.db('billing_events').where({ id: other.event.id }).first()).outcome).toBe('ignored_type');
  });
});

describe('plan limits (402 plan_limit_reached)', () => {
  const expectLimit = (res: ApiResponse, limit: string, value: number, usage: number) => {
    expect(res.status, JSON.stringify(res.body)).toBe(402);
    expect(res.headers.get('content-type')).toContain('application/problem+json');
    expect(res.body).toMatchObject({ code: 'plan_limit_reached', status: 402, limit, limit_value: value, usage, plan: 'free' });
  };

  it('keys: parallel creations pass the limit exactly, RSA too', async () => {
    const u = await registerUser(s.api);
    const results = await Promise.all(Array.from({ length: 5 }, (_, i) => s.api('POST', '/keys', { token: u.token, body: { label: `p${i}` } })));
    expect(results.filter((r) => r.status === 201)).toHaveLength(FREE.keys);
    const refused = results.filter((r) => r.status !== 201);
    expect(refused).toHaveLength(5 - FREE.keys);
    for (const r of refused) expectLimit(r, 'keys', FREE.keys, FREE.keys);
    const rsa = await s.api('POST', '/keys/generate-key', {
      token: u.token,
      form: { label: 'rsa', name: 'R', email: 'r@example.test', passphrase: 'correct horse battery', algorithm: 'rsa3072' },
    });
    expectLimit(rsa, 'keys', FREE.keys, FREE.keys);
  });

  it('managed API keys and shares', async () => {
    const u = await registerUser(s.api);
    const body = { name: 'ci', scopes: ['keys:read'] };
    expect((await s.api('POST', '/api-keys/generate', { token: u.token, body })).status).toBe(201);
    expectLimit(await s.api('POST', '/api-keys/generate', { token: u.token, body }), 'api_keys', FREE.api_keys, FREE.api_keys);

    const key = await createKey(s.api, u.token);
    const shares = await Promise.all([1, 2, 3].map(() => s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint } })));
    expect(shares.filter((r) => r.status === 201)).toHaveLength(FREE.shares);
    for (const r of shares.filter((x) => x.status !== 201)) expectLimit(r, 'shares', FREE.shares, FREE.shares);
  });

  it('file size, concurrent jobs and monthly bytes; encrypted bytes counted by the worker once per job', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const file = (n: number) => ({ name: `f${n}.bin`, data: randomBytes(n) });
    const submit = (n: number) => s.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files: [file(n)] } });

    const big = await submit(FREE.file_size + 1);
    expectLimit(big, 'file_size', FREE.file_size, FREE.file_size + 1);
    // The job started at the first byte (it runs while its upload arrives): it failed with the answer's code.
    expect((await s.c.db('jobs').where({ user_id: u.id })).map((j) => [j.state, j.error?.code])).toEqual([['failed', 'plan_limit_reached']]);

    // Jobs stay queued while the crypto queue is paused: the second is over the concurrency limit.
    const crypto = s.c.jobs.queue('crypto');
    await crypto.pause();
    let first;
    try {
      first = await submit(1500);
      expect(first.status).toBe(202);
      expectLimit(await submit(10), 'concurrent_jobs', FREE.concurrent_jobs, 1);
    } finally {
      await crypto.resume();
    }
    const done = await waitJob(s.api, u.token, first.body.job_id);
    expect(done.state).toBe('completed');
    const usage = await s.c.db('billing_usage').where({ user_id: u.id });
    expect(usage.map((r: { job_id: string; bytes: string }) => [r.job_id, Number(r.bytes)])).toEqual([[first.body.job_id, 1500]]);

    // The same job run again (BullMQ may do that after a crash) counts nothing more.
    await s.c.jobs.enqueue('encrypt-files', { job_id: first.body.job_id }, { jobId: `${first.body.job_id}-again` });
    await new Promise((r) => setTimeout(r, 500));
    expect(await s.c.db('billing_usage').where({ user_id: u.id })).toHaveLength(1);
    expect((await status(s, u.token)).usage.monthly_encrypted_bytes).toBe(1500);

    expectLimit(await submit(1600), 'monthly_encrypted_bytes', FREE.monthly_encrypted_bytes, 1500);
    const fits = await submit(1500);
    expect(fits.status).toBe(202);
    expect((await waitJob(s.api, u.token, fits.body.job_id)).state).toBe('completed');
    expect((await status(s, u.token)).usage).toMatchObject({ monthly_encrypted_bytes: 3000, concurrent_jobs: 0, keys: 1 });
    // Decryption is not counted as encrypted bytes.
    expect(await s.c.db('billing_usage').where({ user_id: u.id })).toHaveLength(2);
  });

  it('concurrent jobs count only jobs that can still finish: one unfinished past the job time limit holds no place', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const submit = () =>
      s.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files: [{ name: 'f.bin', data: randomBytes(10) }] } });
    const crypto = s.c.jobs.queue('crypto');
    await crypto.pause();
    let second;
    try {
      const first = await submit();
      expect(first.status).toBe(202);
      expectLimit(await submit(), 'concurrent_jobs', FREE.concurrent_jobs, 1);
      // Lost: still queued in Postgres, submitted longer ago than JOB_TIMEOUT_SECONDS.
      await s.c
        .db('jobs')
        .where({ id: first.body.job_id })
        .update({ created_at: s.c.db.raw('now() - make_interval(secs => ?)', [s.config.jobLimits.timeoutMs / 1000 + 1]) });
      expect((await status(s, u.token)).usage.concurrent_jobs).toBe(0);
      second = await submit();
      expect(second.status, JSON.stringify(second.body)).toBe(202);
    } finally {
      await crypto.resume();
    }
    expect((await waitJob(s.api, u.token, second.body.job_id)).state).toBe('completed');
  });
});

describe('a worker killed mid billing event', () => {
  it('leaves one effect: the next worker applies the plan change once, with one audit row', async () => {
    const k = await startTestService({ roles: ['web'], env: billingEnv(stripe) });
    const fast = { WORKER_LOCK_MS: '2000', WORKER_STALLED_CHECK_MS: '1000', LOG_LEVEL: 'info', WORKER_QUEUES: 'billing=1' };
    let worker = startProcess('worker', { ...k.env, ...fast });
    try {
      await waitForOutput(worker, 'workers started');
      const u = await customerFor(k);
      const sub = stripe.setSubscription({ id: `sub_${randomBytes(6).toString('hex')}`, customer: u.customer, price: PRICES.pro, status: 'active' });
      // The worker is stopped while it waits for the provider's copy of the subscription.
      const held = stripe.hold(`/v1/subscriptions/${sub.id}`);
      const e = signedEvent('customer.subscription.created', sub);
      expect((await post(k, e)).status).toBe(200);
      await held.arrived;
      worker.kill('SIGKILL');
      await worker.exited;
      held.release();
      expect((await k.c.db('billing_events').where({ id: e.event.id }).first()).processed_at).toBeNull();
      expect((await status(k, u.token)).plan).toBe('free');

      // Killed again, this time inside the transaction: it waits on the account row the test holds.
      worker = startProcess('worker', { ...k.env, ...fast });
      const trx = await k.c.db.transaction();
      try {
        await trx('billing_accounts').where({ user_id: u.id }).forUpdate();
        await expect
          .poll(
            async () =>
              (await k.c.db.raw(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)).rows[0].n,
            { timeout: 20_000, interval: 100 },
          )
          .toBeGreaterThan(0);
        worker.kill('SIGKILL');
        await worker.exited;
      } finally {
        await trx.rollback();
      }
      expect((await k.c.db('billing_events').where({ id: e.event.id }).first()).processed_at).toBeNull();
      expect(await auditRows(k, u.id, 'billing_plans.change')).toHaveLength(0);

      // Twice stalled, BullMQ fails the job (maxStalledCount) and it leaves Redis; the sweep queues the event again.
      worker = startProcess('worker', { ...k.env, ...fast });
      await waitForOutput(worker, 'workers started');
      await expect.poll(() => k.c.jobs.queue('billing').getJobState(`billing-${e.event.id}`), { timeout: 20_000, interval: 200 }).toMatch(/^(failed|unknown)$/);
      await k.c.jobs.enqueue('billing-sweep', { older_than_seconds: 0 });
      await processed(k, e.event.id);
      expect((await status(k, u.token)).plan).toBe('pro');
      expect(await auditRows(k, u.id, 'billing_plans.change')).toHaveLength(1);
      expect(await eventHistory(k.c.redis, k.config.redisPrefix, u.id, { types: ['billing_plans.changed'] })).toHaveLength(1);
      expect((await post(k, e)).body.duplicate).toBe(true);
      await new Promise((r) => setTimeout(r, 500));
      expect(await auditRows(k, u.id, 'billing_plans.change')).toHaveLength(1);
    } finally {
      worker.kill('SIGKILL');
      await k.stop();
    }
  }, 120_000);
});
