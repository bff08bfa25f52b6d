import { z } from 'zod';
import { defineJob } from './define';
import { expiringKeys } from '../db/rotation';
import { publishEvent } from '../lib/events';
import { notify } from '../lib/services/notify';
import { recordAudit } from '../db/audit';

/** How many days ahead of its expiry a key's owner is warned (event and email). */
export const EXPIRY_WARNING_DAYS = 14;

/**
 * Hourly (scheduler): warns owners of keys that expire within EXPIRY_WARNING_DAYS, once per key
 * generation (the mark is set in the same statement that claims the key, so racing sweeps warn once).
 */
export const expirySweep = defineJob({
  queue: 'maintenance',
  name: 'expiry-sweep',
  schema: z.object({}),
  options: { attempts: 3, backoff: { type: 'exponential', delay: 10_000 }, removeOnComplete: { count: 100 }, removeOnFail: { count: 100 } },
  async process(_payload, { c }) {
    const now = c.clock.now();
    let warned = 0;
    for (const key of await expiringKeys(c.db, now, EXPIRY_WARNING_DAYS, 500)) {
      const claimed = await c.db.transaction(async (trx) => {
        const n = await trx('pgp_keys').where({ id: key.key_id }).whereNull('expiry_warned_at').update({ expiry_warned_at: now });
        if (n) await recordAudit(trx, { user_id: key.user_id, action: 'keys.expiry_warning', status: 'success', target: key.fingerprint, details: { expires_at: key.expires_at.toISOString() } });
        return n > 0;
      });
      if (!claimed) continue;
      warned++;
      const expired = key.expires_at <= now;
      await publishEvent(c.redis, c.config.redisPrefix, key.user_id, expired ? 'key.expired' : 'key.expiring', { key_id: key.lineage_id, fingerprint: key.fingerprint, label: key.label, expires_at: key.expires_at.toISOString() }, now);
      await notify(c, key.email, 'key-expiring', { label: key.label, fingerprint: key.fingerprint, expires_at: key.expires_at.toISOString() });
    }
    return { warned };
  },
});
