import { z } from 'zod';
import { defineJob } from '../../jobs/define';

/** Removes what crashed writers left in the blob store (temporary files, incomplete multipart uploads). */
export const sweepBlobs = defineJob({
  queue: 'maintenance',
  name: 'sweep-blobs',
  schema: z.object({}),
  options: { attempts: 3, backoff: { type: 'exponential', delay: 10_000 }, removeOnComplete: { count: 100 }, removeOnFail: { count: 100 } },
  async process(_payload, { c, log }) {
    const olderThan = new Date(c.clock.now().getTime() - c.config.blobTmpMaxAgeHours * 3600_000);
    const removed = await c.blob.sweepStale(olderThan);
    if (removed) log.info({ removed }, 'swept stale temporary blobs');
    return { removed };
  },
});
