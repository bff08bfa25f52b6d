import { defineProcessor } from '../define';
import { expirySweep } from '../../jobs/expiry-sweep';
import { emitEvent } from '../../lib/events';
import { notify } from '../../lib/notify';
import { recordAudit } from '../../db/audit';
import { claimExpiryWarnings, dueExpiryWarnings } from '../../db/keys';

const DAY_MS = 86_400_000;

/**
 * Hourly (scheduler): warns owners of keys whose current generation expires within one of the lead
 * times (KEY_EXPIRY_WARNING_DAYS, default 30, 14, 7 and 1 days), and once more when it has expired
 * (lead 0: `keys.expired`). Each (generation, lead time) is claimed by inserting its row into
 * key_expiry_warnings in the transaction that writes the audit row, so racing sweeps warn once; a
 * generation first seen late gets only its nearest warning (the earlier ones are marked as passed).
 */
export const expirySweepProcessor = defineProcessor(expirySweep, {
  async process(_payload, { c }) {
    const now = c.clock.now();
    const leads = [...c.config.keyLifecycle.expiryWarningDays, 0];
    let warned = 0;
    for (const key of await dueExpiryWarnings(c.db, now, leads, 500)) {
      const due = leads.filter((d) => key.expires_at.getTime() <= now.getTime() + d * DAY_MS);
      if (!due.length) continue;
      const nearest = Math.min(...due);
      const claimed = await c.db.transaction(async (trx) => {
        if (!(await claimExpiryWarnings(trx, key.key_id, due, nearest, now))) return false;
        await recordAudit(trx, {
          user_id: key.user_id,
          action: 'keys.warn_expiry',
          status: 'success',
          target: key.fingerprint,
          details: { expires_at: key.expires_at.toISOString(), lead_days: nearest },
        });
        return true;
      });
      if (!claimed) continue;
      warned++;
      const expired = key.expires_at <= now;
      const data = { lineage_id: key.lineage_id, fingerprint: key.fingerprint, label: key.label, expires_at: key.expires_at.toISOString(), lead_days: nearest };
      await emitEvent(c, key.user_id, expired ? 'keys.expired' : 'keys.expiry_warned', data); // SSE, history and webhooks
      await notify(c, key.email, 'key-expiring', { label: key.label, fingerprint: key.fingerprint, expires_at: key.expires_at.toISOString() });
    }
    return { warned };
  },
});
