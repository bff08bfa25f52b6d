import { defineProcessor } from '../define';
import { billingEvent, billingSweep } from '../../jobs/billing-event';
import { processBillingEvent, requeueUnprocessedEvents } from '../../lib/billing/subscriptions';

/**
 * One inbound payment-provider event, stored by the webhook receiver and processed here: the account's
 * subscription is re-read from the provider and applied with its audit row in one transaction that also
 * marks the event processed (lib/billing/subscriptions.ts). Retried with back-off while the provider is down;
 * the payload is an event id, nothing secret. A job that gives up (or is failed for stalling after
 * repeated crashes) leaves Redis, so the `billing-sweep` can queue its event again under the same id.
 */
export const billingEventProcessor = defineProcessor(billingEvent, {
  async process(payload, { c, origin, log }) {
    const result = await processBillingEvent(c, payload.event_id, origin);
    log.info({ event_id: payload.event_id, outcome: result.outcome }, 'billing event');
    return result;
  },
});

/** Queues again every stored event still unprocessed after `older_than_seconds` (a job that gave up, a lost enqueue). */
export const billingSweepProcessor = defineProcessor(billingSweep, {
  async process(payload, { c, log }) {
    const requeued = await requeueUnprocessedEvents(c, payload.older_than_seconds * 1000);
    if (requeued) log.info({ requeued }, 'billing events queued again');
    return { requeued };
  },
});
