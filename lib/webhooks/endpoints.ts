import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import type { Container } from '../container';
import { conflict, invalid } from '../errors';
import { LruCache } from '../lru';
import { notYours } from '../auth/ownership';
import { endpointsVersionKey, type AccountEvent } from '../event-stream';
import { checkWebhookUrl } from './address';
import { newWebhookSecret, webhookHeaders } from './signature';
import { postWebhook, type AttemptResult } from './send';
import { recordAudit, type RequestMeta } from '../../db/audit';
import {
  pageEndpoints,
  pageDeliveries,
  attemptsOf,
  enabledEndpoints,
  takesEvent,
  findEndpoint,
  lockEndpoint,
  countEndpoints,
  insertEndpoint,
  updateOwnEndpoint,
  deleteOwnEndpoint,
  setEndpointSecrets,
  disableEndpoint,
  disableEndpointsChangedSince,
  findDelivery,
  insertDeliveries,
  markDeliveryPending,
  markDeliveryFailed,
  purgeDeliveriesBefore,
  type AttemptRow,
  type DeliveryRow,
  type DeliveryState,
  type EndpointRow,
  recordAttempt,
} from '../../db/webhooks';
import { lockAccount } from '../../db/users';
import type { AuditAction } from '../event-names';

/**
 * Outbound webhooks (Standard Webhooks): an account's endpoints receive its events as signed POSTs.
 * Each event for each subscribed endpoint is one delivery row whose id is the `webhook-id`; each try
 * is one `deliver-webhook` job run on the `notify` queue and one attempt row.
 */

/** Endpoints per account: deliveries fan out per endpoint, so the count bounds the work of one event. */
const MAX_ENDPOINTS = 20;

export const secretAad = (endpointId: string, which: 'current' | 'previous') => `webhook-secret:${endpointId}:${which}`;

export interface EndpointInput {
  url: string;
  description?: string;
  event_types?: string[];
  enabled?: boolean;
}

async function vetUrl(c: Container, url: string): Promise<void> {
  const problem = await checkWebhookUrl(url, c.config.webhooks.allowPrivate);
  if (problem) throw invalid(problem.code, problem.message, [{ path: 'body.url', message: problem.message }]);
}

/** The caller's endpoint, or 404 (audited as not_owner when it is another account's). */
export async function ownEndpoint(c: Container, userId: string, id: string, meta?: RequestMeta): Promise<EndpointRow> {
  const row = await findEndpoint(c.db, id);
  if (row?.user_id === userId) return row;
  throw await notYours(c, { userId, resource: 'webhook', target: id, existsElsewhere: Boolean(row), meta });
}

const audit = (c: Container, userId: string, action: AuditAction, target: string, meta: RequestMeta, details: Record<string, unknown> = {}) =>
  recordAudit(c.db, { user_id: userId, action, status: 'success', target, details }, meta);

/** Creates an endpoint; its secret is answered here once and stored only sealed. */
export async function createEndpoint(
  c: Container,
  userId: string,
  input: EndpointInput,
  meta: RequestMeta,
): Promise<{ endpoint: EndpointRow; secret: string }> {
  await vetUrl(c, input.url);
  const id = randomUUID();
  const secret = newWebhookSecret();
  const endpoint = await c.db.transaction(async (trx) => {
    // One account's creations are serialised so that concurrent requests cannot pass the limit together.
    await lockAccount(trx, userId);
    if ((await countEndpoints(trx, userId)) >= MAX_ENDPOINTS)
      throw conflict('webhook_limit_reached', `An account has at most ${MAX_ENDPOINTS} webhook endpoints.`);
    const row = await insertEndpoint(trx, {
      id,
      user_id: userId,
      url: input.url,
      description: input.description ?? '',
      event_types: input.event_types ?? [],
      enabled: input.enabled ?? true,
      secret_sealed: c.sealer.seal(secret, secretAad(id, 'current')),
      created_at: c.clock.now(),
      updated_at: c.clock.now(),
    });
    await recordAudit(
      trx,
      { user_id: userId, action: 'webhooks.create', status: 'success', target: id, details: { event_types: input.event_types ?? [] } },
      meta,
    );
    return row;
  });
  await endpointsChanged(c, userId);
  return { endpoint, secret };
}

export async function updateEndpoint(
  c: Container,
  userId: string,
  id: string,
  patch: EndpointInput | Partial<EndpointInput>,
  meta: RequestMeta,
): Promise<EndpointRow> {
  await ownEndpoint(c, userId, id, meta);
  if (patch.url !== undefined) await vetUrl(c, patch.url);
  const changes: Partial<EndpointRow> = { updated_at: c.clock.now() };
  if (patch.url !== undefined) changes.url = patch.url;
  if (patch.description !== undefined) changes.description = patch.description;
  if (patch.event_types !== undefined) changes.event_types = patch.event_types;
  // Turning an endpoint back on clears why the service had turned it off.
  if (patch.enabled !== undefined) Object.assign(changes, { enabled: patch.enabled, disabled_reason: null });
  const row = (await updateOwnEndpoint(c.db, id, userId, changes))!;
  await endpointsChanged(c, userId);
  await audit(c, userId, 'webhooks.update', id, meta, { fields: Object.keys(patch).filter((k) => patch[k as keyof EndpointInput] !== undefined) });
  return row;
}

export async function deleteEndpoint(c: Container, userId: string, id: string, meta: RequestMeta): Promise<void> {
  await ownEndpoint(c, userId, id, meta);
  await deleteOwnEndpoint(c.db, id, userId);
  await endpointsChanged(c, userId);
  await audit(c, userId, 'webhooks.delete', id, meta);
}

/**
 * A new secret, answered once. The old one keeps signing beside it (two signatures per delivery) until
 * the grace period ends, so receivers can switch without losing deliveries.
 */
export async function rotateSecret(
  c: Container,
  userId: string,
  id: string,
  graceMs: number,
  meta: RequestMeta,
): Promise<{ secret: string; previous_secret_expires_at: Date | null }> {
  const secret = newWebhookSecret();
  const expires = graceMs > 0 ? new Date(c.clock.now().getTime() + graceMs) : null;
  await c.db.transaction(async (trx) => {
    const row = await lockEndpoint(trx, id);
    if (row?.user_id !== userId) throw await notYours(c, { userId, resource: 'webhook', target: id, existsElsewhere: Boolean(row), meta });
    const previous = expires ? c.sealer.seal(c.sealer.openText(row.secret_sealed, secretAad(id, 'current')), secretAad(id, 'previous')) : null;
    await setEndpointSecrets(trx, id, {
      secret_sealed: c.sealer.seal(secret, secretAad(id, 'current')),
      previous_secret_sealed: previous,
      previous_secret_expires_at: expires,
      updated_at: c.clock.now(),
    });
    await recordAudit(
      trx,
      { user_id: userId, action: 'webhooks.rotate_secret', status: 'success', target: id, details: { grace_seconds: Math.round(graceMs / 1000) } },
      meta,
    );
  });
  return { secret, previous_secret_expires_at: expires };
}

/** `disabled_reason` of an endpoint a password reset paused: its owner resumes or deletes it on review (lib/accounts/recovery-review.ts). */
const PAUSED_BY_RESET = 'password_reset';

/**
 * In a password reset's transaction: the account's enabled endpoints made or changed at or after `since`
 * stop receiving events (audited `webhooks.disable`). The caller runs endpointsChanged once committed.
 */
export async function pauseEndpointsChangedSince(trx: Knex.Transaction, userId: string, since: Date, at: Date, meta: RequestMeta): Promise<EndpointRow[]> {
  const paused = await disableEndpointsChangedSince(trx, userId, since, PAUSED_BY_RESET, at);
  for (const row of paused)
    await recordAudit(trx, { user_id: userId, action: 'webhooks.disable', status: 'success', target: row.id, details: { reason: PAUSED_BY_RESET } }, meta);
  return paused;
}

/**
 * The owner keeps an endpoint a reset paused: it receives events again, unless it was changed since
 * (turned on, or off by its owner or the service, which then stands). Gone: undefined. The caller runs
 * endpointsChanged once committed.
 */
export async function resumePausedEndpoint(
  trx: Knex.Transaction,
  userId: string,
  id: string,
  at: Date,
  meta: RequestMeta,
): Promise<'resumed' | 'unchanged' | undefined> {
  const row = await lockEndpoint(trx, id);
  if (row?.user_id !== userId) return undefined;
  if (row.enabled || row.disabled_reason !== PAUSED_BY_RESET) return 'unchanged';
  await updateOwnEndpoint(trx, id, userId, { enabled: true, disabled_reason: null, updated_at: at });
  await recordAudit(
    trx,
    { user_id: userId, action: 'webhooks.update', status: 'success', target: id, details: { fields: ['enabled'], reason: 'recovery_review' } },
    meta,
  );
  return 'resumed';
}

/** The owner removes an endpoint on review: deleted with its deliveries (false when already gone). */
export async function deleteReviewedEndpoint(trx: Knex.Transaction, userId: string, id: string, meta: RequestMeta): Promise<boolean> {
  const row = await lockEndpoint(trx, id);
  if (row?.user_id !== userId) return false;
  await deleteOwnEndpoint(trx, id, userId);
  await recordAudit(trx, { user_id: userId, action: 'webhooks.delete', status: 'success', target: id, details: { reason: 'recovery_review' } }, meta);
  return true;
}

/** The secrets that sign a delivery now: the current one, and the previous one during its grace period. */
function signingSecrets(c: Container, row: EndpointRow): string[] {
  const secrets = [c.sealer.openText(row.secret_sealed, secretAad(row.id, 'current'))];
  if (row.previous_secret_sealed && row.previous_secret_expires_at && row.previous_secret_expires_at > c.clock.now()) {
    secrets.push(c.sealer.openText(row.previous_secret_sealed, secretAad(row.id, 'previous')));
  }
  return secrets;
}

async function enqueueAttempts(c: Container, delivery: Pick<DeliveryRow, 'id'>, run: string): Promise<void> {
  await c.jobs.enqueue('deliver-webhook', { delivery_id: delivery.id }, { jobId: `whd-${delivery.id}-${run}` });
}

/**
 * Where an account's events go, without a Postgres query per event (that was 3 queries per rotation and
 * 2 per file job, for the many accounts that have no endpoint at all). Each process keeps an account's
 * enabled endpoints with the version of them it read; every change to an account's endpoints bumps that
 * version in Redis once committed, and each event reads it (with its publication: lib/events.ts) before
 * trusting what it keeps. A bump lost after its commit (Redis gone at that moment) is outlived by
 * TARGETS_MAX_AGE_MS.
 */
const TARGETS_MAX_AGE_MS = 60_000;
const TARGETS_MAX_ACCOUNTS = 10_000;
type Targets = { version: string | null; endpoints: Pick<EndpointRow, 'id' | 'user_id' | 'event_types'>[] };
const targetCaches = new WeakMap<Container, LruCache<string, Targets>>();

/** After a committed change to an account's endpoints: every process reads them again at its next event. */
export async function endpointsChanged(c: Container, userId: string): Promise<void> {
  targetCaches.get(c)?.delete(userId);
  await c.redis
    .incr(endpointsVersionKey(c.config.redisPrefix, userId, c.redis.isCluster))
    .catch((err: unknown) => c.log.warn({ err, user_id: userId }, 'could not announce a webhook endpoint change; other processes see it within a minute'));
}

/** The account's enabled endpoints, given their version in Redis (read here when not given). */
export async function eventTargets(c: Container, userId: string, endpointsVersion?: string | null): Promise<Targets['endpoints']> {
  let cache = targetCaches.get(c);
  if (!cache) targetCaches.set(c, (cache = new LruCache({ max: TARGETS_MAX_ACCOUNTS, ttlMs: TARGETS_MAX_AGE_MS })));
  const version = endpointsVersion === undefined ? await c.redis.get(endpointsVersionKey(c.config.redisPrefix, userId, c.redis.isCluster)) : endpointsVersion;
  const known = cache.get(userId);
  if (known && known.version === version) return known.endpoints;
  return cache.set(userId, { version, endpoints: await enabledEndpoints(c.db, userId) }).endpoints;
}

/**
 * Queues a delivery of an account event to every endpoint subscribed to its type. Called after the
 * event is published; a failure is the caller's to log (the event itself stands).
 */
export async function fanOut(c: Container, event: AccountEvent, endpoints?: Targets['endpoints']): Promise<number> {
  const targets = (endpoints ?? (await eventTargets(c, event.account))).filter((t) => takesEvent(t, event.type));
  if (!targets.length) return 0;
  const body = JSON.stringify(event);
  const now = c.clock.now();
  const rows = await insertDeliveries(
    c.db,
    targets.map((t) => ({
      endpoint_id: t.id,
      user_id: t.user_id,
      event_id: event.id,
      event_type: event.type,
      body,
      next_attempt_at: now,
      created_at: now,
      updated_at: now,
    })),
  );
  await Promise.all(rows.map((d) => enqueueAttempts(c, d, '0')));
  return rows.length;
}

/** A `webhook.test` delivery to one endpoint (enabled or not), through the same queue and signing. */
export async function sendTestPing(c: Container, userId: string, id: string, meta: RequestMeta): Promise<DeliveryRow> {
  const endpoint = await ownEndpoint(c, userId, id, meta);
  const deliveryId = randomUUID();
  const now = c.clock.now();
  const body = JSON.stringify({ id: deliveryId, type: 'webhook.test', created_at: now.toISOString(), account: userId, data: { endpoint_id: endpoint.id } });
  const [row] = await insertDeliveries(c.db, [
    {
      id: deliveryId,
      endpoint_id: endpoint.id,
      user_id: userId,
      event_id: deliveryId,
      event_type: 'webhook.test',
      body,
      next_attempt_at: now,
      created_at: now,
      updated_at: now,
    },
  ]);
  await enqueueAttempts(c, row, '0');
  await audit(c, userId, 'webhooks.send_test', id, meta, { delivery_id: deliveryId });
  return row;
}

export async function ownDelivery(c: Container, userId: string, endpointId: string, deliveryId: string, meta?: RequestMeta): Promise<DeliveryRow> {
  await ownEndpoint(c, userId, endpointId, meta);
  const row = await findDelivery(c.db, deliveryId);
  if (row?.endpoint_id === endpointId) return row;
  throw await notYours(c, { userId, resource: 'webhook_delivery', target: deliveryId, existsElsewhere: Boolean(row), meta });
}

/** Sends a delivery again with the same `webhook-id` (receivers deduplicate by it) and a fresh retry schedule. */
export async function redeliver(c: Container, userId: string, endpointId: string, deliveryId: string, meta: RequestMeta): Promise<DeliveryRow> {
  const endpoint = await ownEndpoint(c, userId, endpointId, meta);
  if (!endpoint.enabled) throw conflict('webhook_disabled', 'The endpoint is disabled; enable it before redelivering.');
  const existing = await ownDelivery(c, userId, endpointId, deliveryId, meta);
  if (existing.state === 'pending') throw conflict('delivery_pending', 'The delivery is still being tried; wait for its outcome.');
  const row = await markDeliveryPending(c.db, deliveryId, c.clock.now());
  await enqueueAttempts(c, row, `r${existing.attempts}`);
  await audit(c, userId, 'webhook_deliveries.redeliver', endpointId, meta, { delivery_id: deliveryId });
  return row;
}

/** What `deliver-webhook` reports for one try. */
export interface TryOutcome {
  result: AttemptResult | null;
  /** The endpoint answered 410 Gone: it is disabled and nothing more is sent to it. */
  gone: boolean;
  /** Why nothing was sent: the delivery or endpoint is gone, disabled or already done. */
  skipped?: 'delivery_missing' | 'endpoint_disabled' | 'not_pending';
}

/**
 * One try of a delivery: signs (the timestamp is this try's), POSTs, records the attempt. `nextDelayMs`
 * is when the queue will try again after a failure (null: this was the last try), for the record.
 */
export async function tryDelivery(c: Container, deliveryId: string, nextDelayMs: number | null): Promise<TryOutcome> {
  const delivery = await findDelivery(c.db, deliveryId);
  if (!delivery) return { result: null, gone: false, skipped: 'delivery_missing' };
  if (delivery.state !== 'pending') return { result: null, gone: false, skipped: 'not_pending' };
  const endpoint = await findEndpoint(c.db, delivery.endpoint_id);
  // A disabled endpoint takes only test pings (a user checking it before turning it back on).
  if (!endpoint || (!endpoint.enabled && delivery.event_type !== 'webhook.test')) {
    await markDeliveryFailed(c.db, deliveryId, c.clock.now());
    return { result: null, gone: false, skipped: 'endpoint_disabled' };
  }
  // Wall-clock time: receivers judge the timestamp against their own clocks (replay protection).
  const headers = webhookHeaders(signingSecrets(c, endpoint), delivery.id, new Date(), delivery.body);
  const result = await postWebhook(endpoint.url, headers, delivery.body, {
    timeoutMs: c.config.webhooks.timeoutMs,
    allowPrivate: c.config.webhooks.allowPrivate,
    userAgent: 'kms-webhooks/1',
  });
  const gone = result.status === 410;
  const ok = result.error === null;
  const now = c.clock.now();
  await c.db.transaction(async (trx) => {
    const last = ok || gone || nextDelayMs === null;
    await recordAttempt(
      trx,
      deliveryId,
      { status_code: result.status, latency_ms: result.latencyMs, error: result.error, created_at: now },
      { state: ok ? 'succeeded' : last ? 'failed' : 'pending', next_attempt_at: last ? null : new Date(now.getTime() + nextDelayMs), updated_at: now },
    );
    if (gone) {
      await disableEndpoint(trx, endpoint.id, 'gone', now);
      await recordAudit(trx, {
        user_id: endpoint.user_id,
        action: 'webhooks.disable',
        status: 'success',
        target: endpoint.id,
        details: { reason: 'gone', delivery_id: deliveryId },
      });
    }
  });
  if (gone) await endpointsChanged(c, endpoint.user_id);
  return { result, gone };
}

/** Delivery records past retention, with their attempts (cascade). */
export async function purgeDeliveries(c: Container): Promise<number> {
  const cutoff = new Date(c.clock.now().getTime() - c.config.webhooks.retentionDays * 86400_000);
  return purgeDeliveriesBefore(c.db, cutoff);
}

/** A page of the account's endpoints, newest first. */
export const listEndpoints = (c: Container, userId: string, q: { page: number; pageSize: number }) => pageEndpoints(c.db, userId, q);

/** A page of one of the caller's endpoints' deliveries (404 when not its), with their attempts. */
export async function listDeliveries(
  c: Container,
  userId: string,
  endpointId: string,
  q: { state?: DeliveryState; page: number; pageSize: number },
  meta: RequestMeta,
  /** Where the deliveries are read (a route's reader); the endpoint named, whose refusal is audited, is looked up in `c`. */
  from: Container = c,
) {
  await ownEndpoint(c, userId, endpointId, meta);
  const { items, total } = await pageDeliveries(from.db, endpointId, q);
  return {
    items,
    total,
    attempts: await deliveryAttempts(
      from,
      items.map((d) => d.id),
    ),
  };
}

/** The attempts of these deliveries, oldest first. */
export const deliveryAttempts = async (c: Container, deliveryIds: string[]): Promise<AttemptRow[]> => (deliveryIds.length ? attemptsOf(c.db, deliveryIds) : []);
