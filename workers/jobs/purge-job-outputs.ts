import { defineProcessor } from '../define';
import { purgeJobOutputs } from '../../jobs/purge-job-outputs';
import { expiredJobs, updateJob } from '../../db/jobs';
import { jobBlob } from '../../lib/jobs/job-records';

/** Deletes the files of jobs past their retention (JOB_RETENTION_HOURS); the rows stay, marked purged. */
export const purgeJobOutputsProcessor = defineProcessor(purgeJobOutputs, {
  async process(_payload, { c, log }) {
    let purged = 0;
    for (;;) {
      const batch = await expiredJobs(c.db, c.clock.now(), 100);
      for (const job of batch) {
        await c.blob.deletePrefix(jobBlob.dir(job.id));
        await updateJob(c.db, job.id, { purged_at: c.clock.now() });
      }
      purged += batch.length;
      if (batch.length < 100) break;
    }
    if (purged) log.info({ purged }, 'purged expired job outputs');
    return { purged };
  },
});
