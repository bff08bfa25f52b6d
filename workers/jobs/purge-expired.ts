import { z } from 'zod';
import { defineJob } from '../../jobs/define';
import { purgeDeliveries } from '../../lib/services/webhooks';
import { purgeShareViews } from '../../lib/services/share-links';

/** Maintenance sweep: drops expired, single-use secrets (reset tokens), and webhook delivery and share view records past retention. */
export const purgeExpired = defineJob({
  queue: 'maintenance',
  name: 'purge-expired',
  schema: z.object({}),
  options: { attempts: 3, backoff: { type: 'exponential', delay: 10_000 }, removeOnComplete: { count: 100 }, removeOnFail: { count: 100 } },
  async process(_payload, { c, log }) {
    const cutoff = new Date(c.clock.now().getTime() - 24 * 3600_000);
    const resets = await c.db('password_resets').where('expires_at', '<', cutoff).delete();
    const webhookDeliveries = await purgeDeliveries(c);
    const shareViews = await purgeShareViews(c);
    log.info({ resets, webhook_deliveries: webhookDeliveries, share_views: shareViews }, 'purged expired records');
    return { password_resets: resets, webhook_deliveries: webhookDeliveries, share_views: shareViews };
  },
});
