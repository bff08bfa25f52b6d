import type { JobOrigin } from '../../jobs/define';
import { reconcileJobs } from '../../jobs/reconcile-jobs';
import { EncryptRequest } from '../../jobs/encrypt-files';
import { defineProcessor, type Processor } from '../define';
import { encryptFilesProcessor } from './encrypt-files';
import { decryptFilesProcessor } from './decrypt-files';
import { generateKeyProcessor } from './generate-key';
import { rotateKeyProcessor } from './rotate-key';
import { rewrapFilesProcessor } from './rewrap-files';
import { signFilesProcessor } from './sign-files';
import { verifyFilesProcessor } from './verify-files';
import type { Container } from '../../lib/container';
import type { Logger } from '../../lib/logger';
import { findJob, isFinished, jobFiles, unfinishedJobsBetween, type JobKind, type JobRow } from '../../db/jobs';
import { jobBlob, recordKeptUploadEnd } from '../../lib/jobs/job-records';

/**
 * Each kind of job the client polls: its processor, and how it is enqueued again from its row alone (as
 * its route enqueued it). Kinds whose payload carries a sealed secret that is never stored (a passphrase,
 * a new key's lock) have no `requeue`: a lost one cannot be run again.
 */
const KINDS: Record<JobKind, { processor: Processor; requeue?: (c: Container, row: JobRow) => Promise<unknown> }> = {
  encrypt: { processor: encryptFilesProcessor, requeue: (c, row) => c.jobs.enqueue('encrypt-files', { job_id: row.id }, { jobId: row.id }) },
  decrypt: { processor: decryptFilesProcessor },
  rewrap: { processor: rewrapFilesProcessor },
  'generate-key': { processor: generateKeyProcessor },
  'rotate-key': { processor: rotateKeyProcessor },
  sign: { processor: signFilesProcessor },
  verify: { processor: verifyFilesProcessor, requeue: (c, row) => c.jobs.enqueue('verify-files', { job_id: row.id }, { jobId: row.id }) },
};

const BATCH = 200;
const SCHEDULER: JobOrigin = { request_id: null, ip: null };

export type Reconciled = 'requeued' | 'lost' | 'kept';

/**
 * Every minute (scheduler): Postgres holds the truth about a job, and a job it says is unfinished must
 * have a live queue entry. A job past the grace period (JOB_RECONCILE_GRACE_SECONDS) whose entry is gone
 * (Redis lost it, or its attempts were spent while its state could not be written) is enqueued again
 * under its own id when its upload ended, its inputs are all still stored and its payload can be made
 * from its row; any other fails with `job_lost`, its files deleted. An upload's end kept in the blob
 * store while Postgres was out of reach (lib/jobs/job-records.ts) is recorded first. Safe on several
 * schedulers at once: BullMQ keeps one entry per id, and the failure is a conditional update of an
 * unfinished row.
 */
export const reconcileJobsProcessor = defineProcessor(reconcileJobs, {
  async process(_payload, { c, log }) {
    const before = new Date(c.clock.now().getTime() - c.config.jobReconcile.graceMs);
    const counts = { requeued: 0, lost: 0, errors: 0 };
    // Jobs enqueued again stay unfinished: the pages go on by creation time.
    for (let after = new Date(0); ;) {
      const batch = await unfinishedJobsBetween(c.db, after, before, BATCH);
      for (const row of batch) {
        const outcome = await reconcileJob(c, row, log).catch((err: unknown) => {
          log.warn({ err, reconciled_job_id: row.id }, 'could not reconcile a job; the next run tries again');
          return 'error' as const;
        });
        if (outcome === 'error') counts.errors++;
        else if (outcome !== 'kept') counts[outcome]++;
      }
      if (batch.length < BATCH) break;
      after = batch[batch.length - 1].created_at;
    }
    if (counts.requeued || counts.lost || counts.errors) log.info(counts, 'reconciled jobs whose queue entry was gone');
    return counts;
  },
});

/** One unfinished job: left alone while its queue entry lives, else enqueued again or failed as lost. */
// Its records name the job they are about `reconciled_job_id`: `log` already carries `job_id`, the
// reconciler's own queue entry (workers/worker.ts), and a second `job_id` key in one record is ambiguous.
async function reconcileJob(c: Container, row: JobRow, log: Logger): Promise<Reconciled> {
  // An upload that ended while Postgres was out of reach, whose API process then stopped before it could
  // record the end: the end its process kept in the blob store is recorded now.
  if (await recordKeptUploadEnd(c, row, SCHEDULER)) {
    log.warn({ reconciled_job_id: row.id, kind: row.kind }, "recorded the end of a job's upload from the record its API process kept");
    row = (await findJob(c.db, row.id)) ?? row;
  }
  const { processor, requeue } = KINDS[row.kind];
  const queue = c.jobs.queue(processor.contract.queue);
  const entry = await queue.getJob(row.id);
  if (entry) {
    const state = await entry.getState();
    if (state !== 'completed' && state !== 'failed') return 'kept';
  }
  // The entry is gone or ended: the row, read again now, says whether the job ended meanwhile (a worker
  // commits the row before its entry goes).
  const current = await findJob(c.db, row.id);
  if (!current || isFinished(current.state)) return 'kept';
  // An ended entry keeps its id: it goes, so that the job can be enqueued under that id again.
  await entry?.remove();
  if (requeue && (await inputsStored(c, current))) {
    await requeue(c, current);
    log.warn({ reconciled_job_id: current.id, kind: current.kind }, 'job had lost its queue entry; enqueued again');
    return 'requeued';
  }
  const failure = {
    code: 'job_lost',
    message: requeue
      ? 'The job was lost before its files were all stored; nothing of it is kept. Submit it again.'
      : 'The job was lost by the queue, and the secret it needed is never stored; nothing of it is kept. Submit it again.',
  };
  // Nothing of the request was done: failing it `job_lost` frees its Idempotency-Key (db/jobs.ts failUnfinishedJob).
  if (!(await processor.failUnfinished!(c, current, failure, SCHEDULER))) return 'kept';
  log.warn({ reconciled_job_id: current.id, kind: current.kind, code: failure.code }, 'job had lost its queue entry; failed');
  return 'lost';
}

/** The upload ended and every input (and a supplied recipient key) is still in the blob store. */
async function inputsStored(c: Container, row: JobRow): Promise<boolean> {
  if (!row.uploaded_at) return false;
  const inputs = await jobFiles(c.db, row.id, 'input');
  if (!inputs.length) return false;
  const keys = inputs.map((f) => jobBlob.input(row.id, f.n));
  const req = EncryptRequest.safeParse(row.request);
  if (row.kind === 'encrypt' && req.success && req.data.recipient.type === 'supplied') keys.push(jobBlob.recipient(row.id));
  for (const key of keys) if (!(await c.blob.stat(key))) return false;
  return true;
}
