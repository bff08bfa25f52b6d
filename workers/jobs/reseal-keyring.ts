import { defineProcessor } from '../define';
import { resealKeyring } from '../../jobs/reseal-keyring';
import { dataKey, finishReseal, reseal } from '../../lib/root-of-trust/operations';

/**
 * After `master-key rotate`: moves every stored seal and row MAC to the new data key
 * (lib/root-of-trust/operations.ts). Its position is in Postgres, so a retry after a crash, or
 * `master-key reseal`, resumes the run. It waits (retries) until the key is current in this process; a
 * run overtaken by a later rotation ends, as the later run moves everything anyway.
 */
export const resealKeyringProcessor = defineProcessor(resealKeyring, {
  async process({ target_kid }, { c, log }) {
    await c.keyring.load();
    const row = await dataKey(c.db, target_kid);
    if (!row) throw new Error(`re-seal: there is no data key "${target_kid}"`);
    if (c.keyring.current().kid !== target_kid) {
      if (row.current_from && row.current_from.getTime() > Date.now())
        throw new Error(`re-seal: data key "${target_kid}" is current from ${row.current_from.toISOString()}`);
      await finishReseal(c.db, target_kid);
      log.info({ target_kid, current_kid: c.keyring.current().kid }, 're-seal overtaken by a later rotation');
      return { superseded: true };
    }
    const run = await reseal(c.db, c.keyring, c.sealer, target_kid, {
      onSkip: (where, err) => log.warn({ where, err: err instanceof Error ? err.message : String(err) }, 're-seal left a value that does not open or verify'),
    });
    log.info({ target_kid, resealed: run.resealed, skipped: run.skipped }, 're-seal finished');
    return { resealed: run.resealed, skipped: run.skipped };
  },
});
