import { UnrecoverableError } from 'bullmq';
import { defineProcessor } from '../define';
import { deliverWebhook } from '../../jobs/deliver-webhook';
import { tryDelivery } from '../../lib/webhooks/endpoints';

/**
 * One webhook delivery, tried on the Standard Webhooks schedule (WEBHOOK_RETRY_SCHEDULE: immediately,
 * then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h, 24 h). Each try is one run of this job and one attempt
 * row; a 410 Gone disables the endpoint and stops. The job leaves Redis when it ends: the delivery
 * and attempt rows are the record.
 */
export const deliverWebhookProcessor = defineProcessor(deliverWebhook, {
  retryDelayMs: (attemptsMade, c) => c.config.webhooks.retryDelaysMs[attemptsMade - 1] ?? -1,
  async process(payload, { c, job, log }) {
    const nextDelay = c.config.webhooks.retryDelaysMs[job.attemptsMade] ?? null;
    const outcome = await tryDelivery(c, payload.delivery_id, nextDelay);
    if (outcome.skipped || !outcome.result) return { skipped: outcome.skipped };
    const { status, error, latencyMs } = outcome.result;
    log.info({ delivery_id: payload.delivery_id, status, error, latency_ms: latencyMs, attempt: job.attemptsMade + 1 }, 'webhook attempt');
    if (outcome.gone) throw new UnrecoverableError('webhook endpoint answered 410 Gone: disabled');
    if (error && nextDelay === null) throw new UnrecoverableError(`webhook delivery failed for good: ${error}`);
    if (error) throw new Error(`webhook attempt failed: ${error}`);
    return { status, latency_ms: latencyMs };
  },
});
