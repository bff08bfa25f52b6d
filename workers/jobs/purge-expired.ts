import { defineProcessor } from '../define';
import { purgeExpired } from '../../jobs/purge-expired';
import { purgeDeliveries } from '../../lib/webhooks/endpoints';
import { purgeShareViews } from '../../lib/sharing/share-links';
import { purgePasswordResetsBefore } from '../../db/password-resets';

/** Maintenance sweep: drops expired, single-use secrets (reset tokens), and webhook delivery and share view records past retention. */
export const purgeExpiredProcessor = defineProcessor(purgeExpired, {
  async process(_payload, { c, log }) {
    const cutoff = new Date(c.clock.now().getTime() - 24 * 3600_000);
    const resets = await purgePasswordResetsBefore(c.db, cutoff);
    const webhookDeliveries = await purgeDeliveries(c);
    const shareViews = await purgeShareViews(c);
    log.info({ resets, webhook_deliveries: webhookDeliveries, share_views: shareViews }, 'purged expired records');
    return { password_resets: resets, webhook_deliveries: webhookDeliveries, share_views: shareViews };
  },
});
