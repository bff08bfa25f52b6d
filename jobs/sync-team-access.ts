import { z } from 'zod';
import { defineContract } from './define';

export const syncTeamAccess = defineContract({
  queue: 'team-sync',
  name: 'sync-team-access',
  schema: z.object({ grantee_id: z.uuid() }),
  options: { attempts: 5, backoff: { type: 'exponential', delay: 2_000 }, removeOnComplete: { age: 3600, count: 1000 }, removeOnFail: { age: 7 * 86400 } },
});
