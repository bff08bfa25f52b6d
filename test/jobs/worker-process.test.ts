import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, waitJob } from '../support/keys';
import { startS3 } from '../support/s3';
import { startProcess, waitForOutput } from '../support/process';

/**
 * The deployment shape: the API in one process, workers in another, sharing Postgres, Redis and an
 * S3-compatible blob store (s3rver on loopback). Nothing but ids crosses the queue.
 */
let s: TestService;
let s3: Awaited<ReturnType<typeof startS3>>;
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kms-e2e-'));
  s3 = await startS3(dir);
  s = await startTestService({ roles: ['web'], env: s3.env });
});
afterAll(async () => {
  await s?.stop();
  await s3?.close();
  await rm(dir, { recursive: true, force: true });
});

describe('a separate worker process on an S3 blob store', () => {
  it('runs encrypt and decrypt jobs end to end, and finishes its active job on SIGTERM', async () => {
    const worker = startProcess('worker', { ...s.env, LOG_LEVEL: 'info', WORKER_QUEUES: 'crypto=1,notify=1' });
    try {
      await waitForOutput(worker, 'workers started');
      const u = await registerUser(s.api);
      const key = await createKey(s.api, u.token);
      const data = randomBytes(24 << 20);
      const enc = await s.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files: [{ name: 'big.bin', data }] } });
      expect(enc.status).toBe(202);
      const encrypted = await waitJob(s.api, u.token, enc.body.job_id);
      expect(encrypted.state, JSON.stringify(encrypted.error)).toBe('completed');
      const ciphertext = await download(s.api, u.token, enc.body.job_id);

      const dec = await s.api('POST', '/keys/decrypt', {
        token: u.token,
        form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'big.bin.gpg', data: ciphertext }] },
      });
      // Stop the worker while the job runs: it must finish the job before it exits.
      await expect
        .poll(async () => (await s.api('GET', `/jobs/${dec.body.job_id}`, { token: u.token })).body.state, { timeout: 15_000, interval: 20 })
        .toBe('active');
      worker.kill('SIGTERM');
      expect(await worker.exited).toBe(0);
      const decrypted = await s.api('GET', `/jobs/${dec.body.job_id}`, { token: u.token });
      expect(decrypted.body.state).toBe('completed');
      expect(Buffer.compare(await download(s.api, u.token, dec.body.job_id), data)).toBe(0);
      expect(worker.output()).toContain('shutting down');
    } finally {
      worker.kill('SIGKILL');
    }
  }, 120_000);
});
