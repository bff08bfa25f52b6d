import { randomUUID } from 'node:crypto';
import { jobDataKeys, type JobDataKeys } from '../../lib/blob/data-keys';
import type { BlobStore } from '../../lib/blob';
import type { Sealer } from '../../lib/sealer';

/**
 * The jobs table's `data_key` column, for tests of the blob stack without a database: `newJob()` records
 * a job whose row holds a key, as the API does; each `keys()` is one process's key store (nothing in
 * memory yet) reading those rows, and key files of jobs from before them from `legacy`.
 */
export function jobKeyRows(sealer: Sealer, legacy?: BlobStore) {
  const rows = new Map<string, string>();
  let lookups = 0;
  return {
    rows,
    lookups: () => lookups,
    keys: (s: Sealer = sealer): JobDataKeys =>
      jobDataKeys(s, {
        lookup: async (jobId) => {
          lookups += 1;
          return rows.get(jobId);
        },
        legacy,
      }),
    newJob(): string {
      const id = randomUUID();
      rows.set(id, jobDataKeys(sealer).mint(id));
      return id;
    },
  };
}
