import type { Knex } from 'knex';
import { newestFirstPage } from './knex';

export interface EndpointRow {
  id: string;
  user_id: string;
  url: string;
  description: string;
  event_types: string[];
  enabled: boolean;
  disabled_reason: string | null;
  secret_sealed: string;
  previous_secret_sealed: string | null;
  previous_secret_expires_at: Date | null;
  created_at: Date;
  updated_at: Date;
}

export type DeliveryState = 'pending' | 'succeeded' | 'failed';

export interface DeliveryRow {
  id: string;
  endpoint_id: string;
  user_id: string;
  event_id: string;
  event_type: string;
  body: string;
  state: DeliveryState;
  attempts: number;
  next_attempt_at: Date | null;
  created_at: Date;
  updated_at: Date;
}

export interface AttemptRow {
  id: number;
  delivery_id: string;
  status_code: number | null;
  latency_ms: number;
  error: string | null;
  created_at: Date;
}

const endpoints = (db: Knex) => db<EndpointRow>('webhook_endpoints');
const deliveries = (db: Knex) => db<DeliveryRow>('webhook_deliveries');
const attempts = (db: Knex) => db<AttemptRow>('webhook_attempts');

export const findEndpoint = async (db: Knex, id: string): Promise<EndpointRow | undefined> => endpoints(db).where({ id }).first();

/** The endpoint row, locked until the transaction ends. */
export const lockEndpoint = async (trx: Knex.Transaction, id: string): Promise<EndpointRow | undefined> => endpoints(trx).where({ id }).forUpdate().first();

export async function countEndpoints(db: Knex, userId: string): Promise<number> {
  const [{ count }] = (await endpoints(db).where({ user_id: userId }).count<{ count: number }[]>({ count: '*' })) as [{ count: number }];
  return Number(count);
}

export async function insertEndpoint(
  trx: Knex.Transaction,
  row: Pick<EndpointRow, 'id' | 'user_id' | 'url' | 'description' | 'event_types' | 'enabled' | 'secret_sealed' | 'created_at' | 'updated_at'>,
): Promise<EndpointRow> {
  const [inserted] = await endpoints(trx).insert(row).returning('*');
  return inserted;
}

/** Changes the account's endpoint; answers it (undefined when the account has no such endpoint). */
export async function updateOwnEndpoint(db: Knex, id: string, userId: string, changes: Partial<EndpointRow>): Promise<EndpointRow | undefined> {
  const [row] = await endpoints(db).where({ id, user_id: userId }).update(changes).returning('*');
  return row;
}

export const deleteOwnEndpoint = async (db: Knex, id: string, userId: string): Promise<void> => {
  await endpoints(db).where({ id, user_id: userId }).delete();
};

export const setEndpointSecrets = async (
  trx: Knex.Transaction,
  id: string,
  secrets: Pick<EndpointRow, 'secret_sealed' | 'previous_secret_sealed' | 'previous_secret_expires_at' | 'updated_at'>,
): Promise<void> => {
  await endpoints(trx).where({ id }).update(secrets);
};

/** The service turns the endpoint off, saying why (`disabled_reason`); the owner turning it on again clears it. */
export const disableEndpoint = async (trx: Knex.Transaction, id: string, reason: string, at: Date): Promise<void> => {
  await endpoints(trx).where({ id }).update({ enabled: false, disabled_reason: reason, updated_at: at });
};

/**
 * Turns off the account's enabled endpoints made or changed at or after `since`, saying why
 * (`disabled_reason`); answers them.
 */
export async function disableEndpointsChangedSince(trx: Knex.Transaction, userId: string, since: Date, reason: string, at: Date): Promise<EndpointRow[]> {
  return endpoints(trx)
    .where({ user_id: userId, enabled: true })
    .andWhere((w) => {
      w.where('created_at', '>=', since).orWhere('updated_at', '>=', since);
    })
    .update({ enabled: false, disabled_reason: reason, updated_at: at })
    .returning('*');
}

export const findDelivery = async (db: Knex, id: string): Promise<DeliveryRow | undefined> => deliveries(db).where({ id }).first();

export const insertDeliveries = async (
  db: Knex,
  rows: (Pick<DeliveryRow, 'endpoint_id' | 'user_id' | 'event_id' | 'event_type' | 'body' | 'next_attempt_at' | 'created_at' | 'updated_at'> &
    Partial<Pick<DeliveryRow, 'id'>>)[],
): Promise<DeliveryRow[]> => deliveries(db).insert(rows).returning('*');

/** The delivery to be tried again from now; answers it. */
export async function markDeliveryPending(db: Knex, id: string, at: Date): Promise<DeliveryRow> {
  const [row] = await deliveries(db).where({ id }).update({ state: 'pending', next_attempt_at: at, updated_at: at }).returning('*');
  return row;
}

/** The delivery ends failed, with no further try. */
export const markDeliveryFailed = async (db: Knex, id: string, at: Date): Promise<void> => {
  await deliveries(db).where({ id }).update({ state: 'failed', next_attempt_at: null, updated_at: at });
};

/** Deletes the deliveries made before `cutoff` that are no longer being tried (their attempts cascade); answers how many. */
export const purgeDeliveriesBefore = async (db: Knex, cutoff: Date): Promise<number> =>
  deliveries(db).where('created_at', '<', cutoff).whereNot({ state: 'pending' }).delete();

/** The enabled endpoints of an account: what its events fan out to (by type: `takesEvent`). */
export const enabledEndpoints = async (db: Knex, userId: string): Promise<Pick<EndpointRow, 'id' | 'user_id' | 'event_types'>[]> =>
  endpoints(db).where({ user_id: userId, enabled: true }).select('id', 'user_id', 'event_types');

/** Whether an endpoint takes events of this type (an empty list takes all). */
export const takesEvent = (endpoint: Pick<EndpointRow, 'event_types'>, type: string): boolean =>
  endpoint.event_types.length === 0 || endpoint.event_types.includes(type);

export async function pageDeliveries(
  db: Knex,
  endpointId: string,
  q: { state?: DeliveryState; page: number; pageSize: number },
): Promise<{ items: DeliveryRow[]; total: number }> {
  const base = deliveries(db).where({ endpoint_id: endpointId });
  if (q.state) base.andWhere({ state: q.state });
  return newestFirstPage<DeliveryRow>(base, q);
}

/** One delivery attempt's outcome: the attempt recorded, the delivery's state and next try set. */
export async function recordAttempt(
  trx: Knex.Transaction,
  deliveryId: string,
  attempt: Pick<AttemptRow, 'status_code' | 'latency_ms' | 'error' | 'created_at'>,
  next: Pick<DeliveryRow, 'state' | 'next_attempt_at' | 'updated_at'>,
): Promise<void> {
  await attempts(trx).insert({ delivery_id: deliveryId, ...attempt });
  await deliveries(trx)
    .where({ id: deliveryId })
    .update({ ...next, attempts: trx.raw('attempts + 1') });
}

export async function attemptsOf(db: Knex, deliveryIds: string[]): Promise<AttemptRow[]> {
  return attempts(db).whereIn('delivery_id', deliveryIds).orderBy('id');
}

/** A page of the account's endpoints, newest first. */
export async function pageEndpoints(db: Knex, userId: string, q: { page: number; pageSize: number }): Promise<{ items: EndpointRow[]; total: number }> {
  const mine = () => endpoints(db).where({ user_id: userId });
  const [items, [count]] = await Promise.all([
    mine()
      .orderBy('created_at', 'desc')
      .orderBy('id')
      .limit(q.pageSize)
      .offset((q.page - 1) * q.pageSize),
    mine().count<{ count: string }[]>({ count: '*' }),
  ]);
  return { items, total: Number(count?.count ?? 0) };
}
