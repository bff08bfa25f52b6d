import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { FORGOTTEN } from '../../workers/tracked';
import { PASSPHRASE, createKey, encrypt, download, runJob } from '../support/keys';

/**
 * The queue dashboard shows finished jobs: BullMQ keeps a bounded number of them for a bounded time,
 * and what it keeps holds no secret, sealed or not.
 */
let s: TestService;

beforeAll(async () => {
  s = await startTestService();
});
afterAll(async () => {
  await s?.stop();
});

describe('finished jobs in the queue', () => {
  it('keeps a completed and a failed decrypt job, bounded, with no passphrase, clear or sealed', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'a.txt', data: Buffer.from('hello') }]);
    const ciphertext = await download(s.api, u.token, enc.job_id);
    const ok = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'a.txt.gpg', data: ciphertext }],
    });
    expect(ok.state, JSON.stringify(ok.error)).toBe('completed');
    // A file that is not an OpenPGP message fails the job in the worker, after the passphrase was checked.
    const bad = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'b.txt.gpg', data: Buffer.from('not a message') }],
    });
    expect(bad.state).toBe('failed');

    const queue = s.c.jobs.queue('crypto');
    for (const [id, state] of [
      [ok.job_id, 'completed'],
      [bad.job_id, 'failed'],
    ] as const) {
      // A job's final state lands in BullMQ just after the job's row (which the API answered from).
      await expect.poll(async () => (await queue.getJob(id))?.getState(), { timeout: 5000 }).toBe(state);
      const job = (await queue.getJob(id))!;
      expect(job.opts.removeOnComplete).toEqual({ age: 24 * 3600, count: 1000 });
      expect(job.opts.removeOnFail).toEqual({ age: 24 * 3600, count: 1000 });
      const kept = JSON.stringify({ data: job.data, returnvalue: job.returnvalue, failedReason: job.failedReason, stacktrace: job.stacktrace });
      expect(kept).not.toContain(PASSPHRASE);
      // Nor its sealed passphrase: of no use once the job has ended.
      expect(job.data.payload).toEqual({ job_id: id, sealed_passphrase: FORGOTTEN });
      expect(kept).not.toMatch(/\bs1\./);
    }
  }, 60_000);
});
