import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { randomBytes } from 'node:crypto';

/**
 * A local stand-in for the payment provider's API, for the real `stripe` SDK pointed at it
 * (STRIPE_API_URL). It records every request (method, path, form body, Idempotency-Key), honours
 * idempotency keys as the provider does (same key: the first answer again), and answers customers,
 * checkout sessions, billing portal sessions and subscriptions in the provider's JSON shapes.
 * Subscriptions are set by the test (what the provider "knows"); a request can be held until released.
 */
interface RecordedRequest {
  method: string;
  path: string;
  form: Record<string, string>;
  idempotencyKey: string | null;
  authorization: string | null;
}

export interface SubscriptionSpec {
  id: string;
  customer: string;
  price: string;
  status: string;
  created?: number;
  current_period_end?: number;
  cancel_at_period_end?: boolean;
}

const rid = (prefix: string) => `${prefix}_${randomBytes(12).toString('hex')}`;
const now = () => Math.floor(Date.now() / 1000);

export function subscriptionObject(s: SubscriptionSpec) {
  const created = s.created ?? now();
  const end = s.current_period_end ?? created + 30 * 86400;
  return {
    id: s.id,
    object: 'subscription',
    customer: s.customer,
    status: s.status,
    created,
    cancel_at_period_end: s.cancel_at_period_end ?? false,
    livemode: false,
    metadata: {},
    latest_invoice: null,
    items: {
      object: 'list',
      has_more: false,
      url: `/v1/subscription_items?subscription=${s.id}`,
      data: [
        {
          id: `si_${s.id}`,
          object: 'subscription_item',
          quantity: 1,
          current_period_start: created,
          current_period_end: end,
          price: { id: s.price, object: 'price', active: true, currency: 'eur', unit_amount: 1000 },
        },
      ],
    },
  };
}

export async function startStripeServer(opts: { latencyMs?: number } = {}) {
  const requests: RecordedRequest[] = [];
  const subscriptions = new Map<string, ReturnType<typeof subscriptionObject>>();
  const replies = new Map<string, { status: number; body: unknown }>();
  const customers = new Map<string, Record<string, unknown>>();
  const holds: { prefix: string; arrived: () => void; released: Promise<void> }[] = [];

  function answer(res: ServerResponse, status: number, body: unknown) {
    res.writeHead(status, { 'content-type': 'application/json', 'request-id': rid('req') });
    res.end(JSON.stringify(body, null, 2));
  }
  const missing = (what: string, id: string) => ({
    status: 404,
    body: { error: { type: 'invalid_request_error', code: 'resource_missing', message: `No such ${what}: '${id}'`, param: 'id' } },
  });

  function route(method: string, path: string, form: Record<string, string>): { status: number; body: unknown } {
    if (method === 'POST' && path === '/v1/customers') {
      const customer = {
        id: rid('cus'),
        object: 'customer',
        email: form.email ?? null,
        created: now(),
        livemode: false,
        metadata: { user_id: form['metadata[user_id]'] },
      };
      customers.set(customer.id, customer);
      return { status: 200, body: customer };
    }
    if (method === 'POST' && path === '/v1/checkout/sessions') {
      if (!form.customer || !customers.has(form.customer)) return missing('customer', form.customer ?? '');
      const id = rid('cs_test');
      return {
        status: 200,
        body: {
          id,
          object: 'checkout.session',
          mode: form.mode,
          customer: form.customer,
          client_reference_id: form.client_reference_id ?? null,
          status: 'open',
          subscription: null,
          success_url: form.success_url,
          cancel_url: form.cancel_url,
          url: `https://checkout.stripe.test/c/pay/${id}`,
          created: now(),
          expires_at: now() + 86400,
          livemode: false,
          metadata: { user_id: form['metadata[user_id]'], plan: form['metadata[plan]'] },
        },
      };
    }
    if (method === 'POST' && path === '/v1/billing_portal/sessions') {
      if (!form.customer || !customers.has(form.customer)) return missing('customer', form.customer ?? '');
      const id = rid('bps');
      return {
        status: 200,
        body: {
          id,
          object: 'billing_portal.session',
          customer: form.customer,
          return_url: form.return_url,
          url: `https://billing.stripe.test/p/session/${id}`,
          created: now(),
          livemode: false,
        },
      };
    }
    const sub = /^\/v1\/subscriptions\/([A-Za-z0-9_]+)$/.exec(path);
    if (method === 'GET' && sub) {
      const found = subscriptions.get(sub[1]);
      return found ? { status: 200, body: found } : missing('subscription', sub[1]);
    }
    return { status: 404, body: { error: { type: 'invalid_request_error', message: `Unrecognized request URL (${method}: ${path})` } } };
  }

  async function respond(req: IncomingMessage, res: ServerResponse, body: string) {
    const url = new URL(req.url ?? '/', 'http://local');
    const form = Object.fromEntries(new URLSearchParams(req.method === 'GET' ? url.search : body));
    const idempotencyKey = (req.headers['idempotency-key'] as string | undefined) ?? null;
    requests.push({ method: req.method ?? '', path: url.pathname, form, idempotencyKey, authorization: req.headers.authorization ?? null });
    const hold = holds.find((h) => url.pathname.startsWith(h.prefix));
    if (hold) {
      holds.splice(holds.indexOf(hold), 1);
      hold.arrived();
      await hold.released;
    }
    if (opts.latencyMs) await new Promise((r) => setTimeout(r, opts.latencyMs));
    const key = idempotencyKey ? `${req.method} ${url.pathname} ${idempotencyKey}` : null;
    const reply = (key && replies.get(key)) || route(req.method ?? 'GET', url.pathname, form);
    if (key && !replies.has(key)) replies.set(key, reply);
    answer(res, reply.status, reply.body);
  }

  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      // A failure of this double answers as Stripe answers its own: a 500 api_error.
      respond(req, res, Buffer.concat(chunks).toString()).catch((err: unknown) =>
        answer(res, 500, { error: { type: 'api_error', message: err instanceof Error ? err.message : String(err) } }),
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;

  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    customers,
    /** What the provider knows about a subscription from now on. */
    setSubscription(spec: SubscriptionSpec) {
      const obj = subscriptionObject(spec);
      subscriptions.set(spec.id, obj);
      return obj;
    },
    /**
     * Holds the next request whose path starts with `prefix` until `release()`; `arrived` resolves when
     * it has come in (the caller is then waiting on the provider).
     */
    hold(prefix: string) {
      let arrived!: () => void;
      let release!: () => void;
      const arrival = new Promise<void>((r) => (arrived = r));
      const released = new Promise<void>((r) => (release = r));
      holds.push({ prefix, arrived, released });
      return { arrived: arrival, release };
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
export type StripeServer = Awaited<ReturnType<typeof startStripeServer>>;
