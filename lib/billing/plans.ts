import { z } from 'zod';

/**
 * Plans and the limits the service enforces for each. `free` is the default: every account without a
 * live subscription is on it. A paid plan names the provider price that buys it (STRIPE_PRICE_<PLAN>);
 * a subscription to a price no plan names is treated as the default plan (and logged).
 * Limits are counts or bytes; `null` means no plan limit (the service's own hard limits still apply).
 */
export const PLAN_IDS = ['free', 'pro', 'business'] as const;
export type PlanId = (typeof PLAN_IDS)[number];
export const DEFAULT_PLAN: PlanId = 'free';

export const LIMIT_NAMES = ['keys', 'api_keys', 'shares', 'monthly_encrypted_bytes', 'concurrent_jobs', 'file_size'] as const;
export type LimitName = (typeof LIMIT_NAMES)[number];
type Limits = Record<LimitName, number | null>;

export const LIMIT_DESCRIPTIONS: Record<LimitName, string> = {
  keys: 'keys (lineages) not disabled',
  api_keys: 'managed API keys not revoked',
  shares: 'share links (public key and API key shares) not revoked and not expired',
  monthly_encrypted_bytes: 'plaintext bytes encrypted per calendar month (UTC), counting jobs still queued or running',
  concurrent_jobs: 'encrypt and decrypt jobs queued or running at once',
  file_size: 'bytes of one file in an encrypt or decrypt job',
};

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

const DEFAULT_LIMITS: Record<PlanId, Limits> = {
  free: { keys: 5, api_keys: 2, shares: 10, monthly_encrypted_bytes: 1 * GiB, concurrent_jobs: 2, file_size: 100 * MiB },
  pro: { keys: 100, api_keys: 20, shares: 500, monthly_encrypted_bytes: 200 * GiB, concurrent_jobs: 8, file_size: 8 * GiB },
  business: { keys: 1000, api_keys: 50, shares: 10_000, monthly_encrypted_bytes: 5 * 1024 * GiB, concurrent_jobs: 20, file_size: 8 * GiB },
};

export interface Plan {
  id: PlanId;
  /** The provider price that buys it; null for the default plan (and for a paid plan with no price configured: not for sale). */
  priceId: string | null;
  limits: Limits;
}
export type Plans = Record<PlanId, Plan>;

/** `BILLING_PLANS`: JSON overriding some limits of some plans, e.g. `{"free":{"keys":3,"file_size":null}}`. */
const Overrides = z.partialRecord(
  z.enum(PLAN_IDS),
  z
    .object(
      Object.fromEntries(LIMIT_NAMES.map((n) => [n, z.number().int().min(0).nullable().optional()])) as Record<
        LimitName,
        z.ZodOptional<z.ZodNullable<z.ZodNumber>>
      >,
    )
    .strict(),
);

export function buildPlans(prices: Partial<Record<PlanId, string | undefined>>, overridesJson: string | undefined): Plans {
  let overrides: z.infer<typeof Overrides> = {};
  if (overridesJson) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(overridesJson);
    } catch {
      throw new Error('BILLING_PLANS must be JSON, e.g. {"free":{"keys":3}}');
    }
    const result = Overrides.safeParse(parsed);
    if (!result.success) throw new Error(`BILLING_PLANS: ${result.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`);
    overrides = result.data;
  }
  const plans = {} as Plans;
  for (const id of PLAN_IDS) {
    const over = Object.fromEntries(Object.entries(overrides[id] ?? {}).filter(([, v]) => v !== undefined));
    plans[id] = { id, priceId: id === DEFAULT_PLAN ? null : (prices[id] ?? null), limits: { ...DEFAULT_LIMITS[id], ...over } };
  }
  const seen = new Map<string, PlanId>();
  for (const p of Object.values(plans)) {
    if (!p.priceId) continue;
    if (seen.has(p.priceId)) throw new Error(`STRIPE_PRICE_${p.id.toUpperCase()} is the same price as STRIPE_PRICE_${seen.get(p.priceId)!.toUpperCase()}`);
    seen.set(p.priceId, p.id);
  }
  return plans;
}

/** The plan a provider price buys, or undefined for a price no plan names. */
export const planForPrice = (plans: Plans, priceId: string | null | undefined): Plan | undefined =>
  priceId ? Object.values(plans).find((p) => p.priceId === priceId) : undefined;

export type BillingMode = 'disabled' | 'test' | 'live';

/** The mode follows the secret key's prefix (secret or restricted key); anything else is refused. */
export function billingModeOf(secretKey: string | undefined): BillingMode {
  if (!secretKey) return 'disabled';
  if (/^(sk|rk)_test_/.test(secretKey)) return 'test';
  if (/^(sk|rk)_live_/.test(secretKey)) return 'live';
  throw new Error('STRIPE_SECRET_KEY must start with sk_test_, sk_live_, rk_test_ or rk_live_');
}
