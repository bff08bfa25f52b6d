import { z } from 'zod';
import { route } from '../../route';
import type { AppContext } from '../../context';
import { receiveWebhook } from '../../../lib/billing/subscriptions';
import { AppError, badRequest, tooLarge } from '../../../lib/errors';

/**
 * Billing (SPEC.md "Billing"): the provider's webhook is public and proves itself by its signature over
 * the raw body (status, checkout and portal: subscription.ts).
 */
const tags = ['Billing'];

/** Webhook bodies are small; this bounds what is read when the body was not parsed as JSON. */
const MAX_WEBHOOK_BYTES = 1024 * 1024;

/**
 * The exact bytes the provider signed. The app's JSON parser keeps them as `rawBody` (koa-body
 * `includeUnparsed`); a body it did not parse (another content type) is read here. A JSON body parsed
 * without its raw bytes cannot be verified: re-serialising it would not give the signed bytes.
 */
async function rawBody(ctx: AppContext): Promise<string | Buffer> {
  if (typeof ctx.request.rawBody === 'string') return ctx.request.rawBody;
  if (ctx.request.body !== undefined || ctx.req.readableEnded) {
    // Answered 5xx so the provider retries once the service is fixed; the cause is in the log (koa-body without includeUnparsed).
    ctx.state.log.error('billing webhook: the JSON body was parsed without its raw bytes (koa-body includeUnparsed is off); cannot verify');
    throw new AppError(500, 'raw_body_unavailable', 'The webhook could not be verified on our side; it was not stored.');
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of ctx.req) {
    size += (chunk as Buffer).length;
    if (size > MAX_WEBHOOK_BYTES) throw tooLarge('payload_too_large', 'The webhook body is larger than accepted.');
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

export default [
  route({
    method: 'post',
    path: '/billing/webhooks/stripe',
    summary:
      "The payment provider's webhook receiver: verified by its Stripe-Signature over the raw body, stored once by event id, processed by the billing queue",
    tags,
    access: 'public',
    responses: {
      200: {
        description: 'Stored (or already stored: `duplicate`)',
        schema: z.object({ received: z.literal(true), event_id: z.string(), duplicate: z.boolean() }),
      },
    },
    async handler({ c, ctx }) {
      const signature = ctx.get('stripe-signature') || undefined;
      if (!signature) throw badRequest('invalid_signature', 'The Stripe-Signature header is missing.');
      const result = await receiveWebhook(c, await rawBody(ctx), signature);
      return { body: { received: true, ...result } };
    },
  }),
];
