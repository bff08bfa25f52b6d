import { z } from 'zod';
import { defineJob } from '../../jobs/define';
import { AppError } from '../../lib/errors';
import { markSyncFailed, syncGrants } from '../../lib/services/team-access';

/**
 * Recomputes one account's inherited key grants from its team access link (lib/services/team-access.ts
 * syncGrants): one transaction, idempotent, so a retry after a crash or a duplicate run changes nothing
 * more. Queued on link, on the source's key changes and when the source leaves. The last failed try
 * marks the link `failed`; the grants stay as the last good run left them.
 */
export const syncTeamAccess = defineJob({
  queue: 'team-sync',
  name: 'sync-team-access',
  schema: z.object({ grantee_id: z.uuid() }),
  options: { attempts: 5, backoff: { type: 'exponential', delay: 2_000 }, removeOnComplete: { age: 3600, count: 1000 }, removeOnFail: { age: 7 * 86400 } },
  async process(payload, { c, job, origin }) {
    try {
      const outcome = await syncGrants(c, payload.grantee_id, origin);
      return { linked: outcome.linked, state: outcome.state ?? null, inherited_keys: outcome.inherited_keys, added: outcome.added.length, removed: outcome.removed.length };
    } catch (err) {
      if (job.attemptsMade + 1 >= (job.opts.attempts ?? 1)) await markSyncFailed(c, payload.grantee_id, err instanceof AppError ? err.code : 'sync_failed');
      throw err;
    }
  },
});
