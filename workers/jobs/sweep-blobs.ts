import { defineProcessor } from '../define';
import { sweepBlobs } from '../../jobs/sweep-blobs';

/** Removes what crashed writers left in the blob store (temporary files, incomplete multipart uploads). */
export const sweepBlobsProcessor = defineProcessor(sweepBlobs, {
  async process(_payload, { c, log }) {
    const olderThan = new Date(c.clock.now().getTime() - c.config.blobTmpMaxAgeHours * 3600_000);
    const removed = await c.blob.sweepStale(olderThan);
    if (removed) log.info({ removed }, 'swept stale temporary blobs');
    return { removed };
  },
});
