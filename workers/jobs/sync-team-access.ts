import { defineProcessor } from '../define';
import { syncTeamAccess } from '../../jobs/sync-team-access';
import { AppError } from '../../lib/errors';
import { markSyncFailed, syncGrants } from '../../lib/teams/team-access';

/**
 * Recomputes one account's inherited key grants from its team access link (lib/teams/team-access.ts
 * syncGrants): one transaction, idempotent, so a retry after a crash or a duplicate run changes nothing
 * more. Queued on link, on the source's key changes and when the source leaves. The last failed try
 * marks the link `failed`; the grants stay as the last good run left them.
 */
export const syncTeamAccessProcessor = defineProcessor(syncTeamAccess, {
  async process(payload, { c, job, origin }) {
    try {
      const outcome = await syncGrants(c, payload.grantee_id, origin);
      return {
        linked: outcome.linked,
        state: outcome.state ?? null,
        inherited_keys: outcome.inherited_keys,
        added: outcome.added.length,
        removed: outcome.removed.length,
      };
    } catch (err) {
      if (job.attemptsMade + 1 >= (job.opts.attempts ?? 1)) await markSyncFailed(c, payload.grantee_id, err instanceof AppError ? err.code : 'sync_failed');
      throw err;
    }
  },
});
