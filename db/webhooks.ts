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

export const endpoints = (db: Knex) => db<EndpointRow>('webhook_endpoints');
export const deliveries = (db: Knex) => db<DeliveryRow>('webhook_deliveries');
const attempts = (db: Knex) => db<AttemptRow>('webhook_attempts');

/** The enabled endpoints of an account: what its events fan out to (by type: `takesEvent`). */
export const enabledEndpoints = (db: Knex, userId: string): Promise<Pick<EndpointRow, 'id' | 'user_id' | 'event_types'>[]> =>
  endpoints(db).where({ user_id: userId, enabled: true }).select('id', 'user_id', 'event_types');

/** Whether an endpoint takes events of this type (an empty list takes all). */
export const takesEvent = (endpoint: Pick<EndpointRow, 'event_types'>, type: string) =>
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

export function attemptsOf(db: Knex, deliveryIds: string[]): Promise<AttemptRow[]> {
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
