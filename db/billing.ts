import type { Knex } from 'knex';
import type { Write } from './knex';

export interface BillingAccountRow {
  user_id: string;
  customer_id: string | null;
  subscription_id: string | null;
  plan: string;
  status: string;
  current_period_end: Date | null;
  cancel_at_period_end: boolean;
  past_due_since: Date | null;
  synced_at: Date | null;
  created_at: Date;
  updated_at: Date;
}

export interface BillingEventRow {
  id: string;
  type: string;
  livemode: boolean;
  provider_created_at: Date;
  object_id: string | null;
  customer_id: string | null;
  subscription_id: string | null;
  user_id: string | null;
  received_at: Date;
  processed_at: Date | null;
  outcome: string | null;
}

const billingAccounts = (db: Knex) => db<BillingAccountRow>('billing_accounts');
const billingEvents = (db: Knex) => db<BillingEventRow>('billing_events');

export const findBillingAccount = async (db: Knex, userId: string): Promise<BillingAccountRow | undefined> =>
  billingAccounts(db).where({ user_id: userId }).first();

/** The account's billing row, made if missing, locked until the transaction ends (one customer per account). */
export async function lockBillingAccount(trx: Knex.Transaction, userId: string, now: Date): Promise<BillingAccountRow> {
  await billingAccounts(trx).insert({ user_id: userId, created_at: now, updated_at: now }).onConflict('user_id').ignore();
  return (await billingAccounts(trx).where({ user_id: userId }).forUpdate().first())!;
}

/** The billing row of the provider's customer, locked until the transaction ends. */
export const lockBillingAccountOfCustomer = async (trx: Knex.Transaction, customerId: string): Promise<BillingAccountRow | undefined> =>
  billingAccounts(trx).where({ customer_id: customerId }).forUpdate().first();

export const setBillingCustomer = async (trx: Knex.Transaction, userId: string, customerId: string, at: Date): Promise<void> => {
  await billingAccounts(trx).where({ user_id: userId }).update({ customer_id: customerId, updated_at: at });
};

/** The subscription state as last read from the provider; answers the account's billing row. */
export async function updateSubscription(
  trx: Knex.Transaction,
  userId: string,
  fields: Pick<
    BillingAccountRow,
    'subscription_id' | 'plan' | 'status' | 'current_period_end' | 'cancel_at_period_end' | 'past_due_since' | 'synced_at' | 'updated_at'
  >,
): Promise<BillingAccountRow> {
  const [after] = await billingAccounts(trx).where({ user_id: userId }).update(fields).returning('*');
  return after;
}

export const findBillingEvent = async (db: Knex, id: string): Promise<BillingEventRow | undefined> => billingEvents(db).where({ id }).first();

/** The event row, locked: one worker at a time processes it. */
export const lockBillingEvent = async (trx: Knex.Transaction, id: string): Promise<BillingEventRow | undefined> =>
  billingEvents(trx).where({ id }).forUpdate().first();

export const markBillingEventProcessed = async (
  trx: Knex.Transaction,
  id: string,
  done: Pick<BillingEventRow, 'processed_at' | 'outcome' | 'user_id'>,
): Promise<void> => {
  await billingEvents(trx).where({ id }).update(done);
};

/** Ids of events still unprocessed that arrived at or before `before`, oldest first, at most `limit`. */
export async function unprocessedBillingEvents(db: Knex, before: Date, limit: number): Promise<string[]> {
  const rows = await billingEvents(db).whereNull('processed_at').where('received_at', '<=', before).orderBy('received_at').limit(limit).select('id');
  return rows.map((r) => r.id);
}

/** Stores an inbound event once; false when its id was stored before (a replay). */
export async function insertBillingEvent(db: Knex, row: Omit<BillingEventRow, 'processed_at' | 'outcome' | 'user_id'>): Promise<boolean> {
  const inserted = await billingEvents(db).insert(row).onConflict('id').ignore().returning('id');
  return inserted.length > 0;
}

/** `YYYY-MM` of a time, UTC: the usage period. */
export const usagePeriod = (at: Date): string => at.toISOString().slice(0, 7);

/** Counts an encrypt job's plaintext bytes once (its id is the key); a write that lands with the job's completion (jobs/tracked.ts `writes`). */
export const recordUsage = (db: Knex, entry: { jobId: string; userId: string; bytes: number; at: Date }): Write =>
  db<object>('billing_usage')
    .insert({ job_id: entry.jobId, user_id: entry.userId, period: usagePeriod(entry.at), bytes: entry.bytes, created_at: entry.at })
    .onConflict('job_id')
    .ignore();

export interface Usage {
  keys: number;
  api_keys: number;
  shares: number;
  /** Completed this month plus encrypt jobs that can still finish (their bytes will count). */
  monthly_encrypted_bytes: number;
  /** File jobs that can still finish: unfinished, and submitted less than the job time limit ago. */
  concurrent_jobs: number;
}

const FILE_JOB_KINDS = ['encrypt', 'decrypt'];

/**
 * Everything a plan limits, for one account, in ONE statement (one snapshot: a job that completes
 * meanwhile is counted either as running or as used, never as both or neither).
 */
export async function accountUsage(db: Knex, userId: string, now: Date, jobTimeoutMs: number): Promise<Usage> {
  // A job past its deadline (submission + JOB_TIMEOUT_SECONDS, by the database's clock, as `created_at`)
  // cannot finish any more: it is lost, and the job reconciler fails it; it holds no place meanwhile.
  const live = (q: Knex.QueryBuilder) =>
    q
      .where({ user_id: userId })
      .whereIn('state', ['queued', 'active'])
      .where('created_at', '>', db.raw('now() - make_interval(secs => ?)', [jobTimeoutMs / 1000]));
  const row = await db
    .select({
      keys: db('key_lineages').count('*').where({ user_id: userId }).whereNull('disabled_at'),
      api_keys: db('api_keys').count('*').where({ user_id: userId }).whereNull('revoked_at'),
      shares: db('share_links')
        .count('*')
        .where({ user_id: userId })
        .whereNull('revoked_at')
        .andWhere((q) => {
          q.whereNull('expires_at').orWhere('expires_at', '>', now);
        })
        .andWhere((q) => {
          q.whereNull('view_limit').orWhereRaw('view_count < view_limit');
        }),
      used_bytes: db('billing_usage')
        .sum('bytes')
        .where({ user_id: userId, period: usagePeriod(now) }),
      pending_bytes: live(db('jobs').select(db.raw("coalesce(sum((progress->>'bytes_total')::bigint), 0)")).where({ kind: 'encrypt' })),
      concurrent_jobs: live(db('jobs').count('*').whereIn('kind', FILE_JOB_KINDS)),
    })
    .first<Record<string, string | number | null>>();
  const n = (v: string | number | null | undefined) => Number(v ?? 0);
  return {
    keys: n(row.keys),
    api_keys: n(row.api_keys),
    shares: n(row.shares),
    monthly_encrypted_bytes: n(row.used_bytes) + n(row.pending_bytes),
    concurrent_jobs: n(row.concurrent_jobs),
  };
}
