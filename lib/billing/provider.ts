import type Stripe from 'stripe';
import type { Config } from '../config';
import { badRequest, conflict, unavailable } from '../errors';

/**
 * The payment provider (Stripe) through its own SDK. One client per configuration; STRIPE_API_URL points
 * it elsewhere (tests run a local stand-in). Every POST carries an Idempotency-Key chosen by the caller,
 * so the SDK's own retries and ours never create a second customer or session.
 *
 * The SDK is loaded on first use: its hundreds of modules are tens of thousands of objects that every
 * mark-compact of a process would otherwise walk, in every API and worker process, billing or not.
 */
export type ProviderEvent = Stripe.Event;
export type ProviderSubscription = Stripe.Subscription;

/** Signed webhooks older (or newer) than this are refused: Stripe's own default tolerance. */
const WEBHOOK_TOLERANCE_SECONDS = 300;

const loadSdk = async () => (await import('stripe')).default;

const clients = new WeakMap<Config, Stripe>();

/** The provider client, or 409 `billing_disabled` when no STRIPE_SECRET_KEY is configured. */
export async function providerClient(config: Config): Promise<Stripe> {
  const { mode, api } = config.billing;
  if (mode === 'disabled' || !config.stripe.secretKey) throw billingDisabled();
  let client = clients.get(config);
  if (!client) {
    const Sdk = await loadSdk();
    client = new Sdk(config.stripe.secretKey, { ...(api ?? {}), maxNetworkRetries: 2, timeout: 15_000, telemetry: false });
    clients.set(config, client);
  }
  return client;
}

const billingDisabled = () =>
  conflict('billing_disabled', 'Billing is not enabled on this service (no payment provider is configured); every account is on the default plan.');

/**
 * Verifies a webhook's `Stripe-Signature` over the exact bytes received and returns the event.
 * `now` is the service clock: a signature outside WEBHOOK_TOLERANCE_SECONDS of it is refused (replays
 * of old captures). Any failure is 400 `invalid_signature`; nothing about the secret is said.
 */
export async function verifyWebhook(config: Config, raw: string | Buffer, signature: string | undefined, now: Date): Promise<ProviderEvent> {
  const secret = config.stripe.webhookSecret;
  if (config.billing.mode === 'disabled' || !secret) throw billingDisabled();
  if (!signature) throw badRequest('invalid_signature', 'The Stripe-Signature header is missing.');
  // The SDK refuses old timestamps only; one from the future is refused here too (a clock-skewed or forged capture).
  const t = Number(/(?:^|,)\s*t=(\d{1,12})(?:,|$)/.exec(signature)?.[1] ?? NaN);
  if (t > now.getTime() / 1000 + WEBHOOK_TOLERANCE_SECONDS)
    throw badRequest('invalid_signature', 'The webhook signature does not verify, or its timestamp is outside the tolerance.');
  const Sdk = await loadSdk();
  try {
    // receivedAt is in milliseconds.
    return Sdk.webhooks.constructEvent(raw, signature, secret, WEBHOOK_TOLERANCE_SECONDS, undefined, now.getTime());
  } catch (err) {
    if (err instanceof Sdk.errors.StripeSignatureVerificationError)
      throw badRequest('invalid_signature', 'The webhook signature does not verify, or its timestamp is outside the tolerance.');
    throw badRequest('malformed_event', 'The webhook body is not a provider event.');
  }
}

/** Provider failures become 503 (try again; the idempotency key makes that safe); the provider's text is not passed on. */
export async function callProvider<T>(what: string, call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (err) {
    // A call reaches the provider only through a client, so the SDK is loaded by now.
    if (err instanceof (await loadSdk()).errors.StripeError) {
      const e = new Error(`payment provider: ${what} failed (${err.type}${err.code ? `, ${err.code}` : ''}, status ${err.statusCode ?? 'none'})`);
      throw Object.assign(unavailable('provider_unavailable', 'The payment provider could not complete the request; try again shortly.'), { cause: e });
    }
    throw err;
  }
}
