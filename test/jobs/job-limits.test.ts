import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { registerUser, startTestService, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, encrypt, waitJob } from '../support/keys';
import { armorMessage, flipInnerTag } from '../support/tamper';
import { FORGOTTEN } from '../../workers/tracked';

/**
 * Job limits: hostile input fails a job within seconds (no-progress limit) and frees its worker slot;
 * outputs have a per-job quota; decrypted plaintext is kept for less time; Idempotency-Key replays must
 * be the same request; another account's job is 404 and audited.
 */
let s: TestService;

beforeAll(async () => {
  // One crypto slot: a stalled job would hold up everything queued behind it.
  s = await startTestService({ env: { WORKER_QUEUES: 'crypto=1,notify=1', JOB_IDLE_SECONDS: '2', MAX_JOB_OUTPUT_BYTES: String(3 << 20) } });
});
afterAll(async () => {
  await s?.stop();
});

async function blobsOf(jobId: string): Promise<string[]> {
  return readdir(join(s.env.BLOB_STORE_URL, 'jobs', jobId), { recursive: true }).catch(() => []);
}

describe('hostile input', () => {
  it('a one-byte change that stalls the parser fails the job within seconds (binary and armored), and the job behind it runs', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const plain = randomBytes(4096);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'a.bin', data: plain }]);
    const ciphertext = await download(s.api, u.token, enc.job_id);
    const tampered = flipInnerTag(ciphertext);

    for (const [name, data] of [
      ['a.bin.gpg', tampered],
      ['a.bin.asc', armorMessage(tampered)],
    ] as const) {
      const started = Date.now();
      const bad = await s.api('POST', '/keys/decrypt', {
        token: u.token,
        form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name, data }] },
      });
      expect(bad.status, JSON.stringify(bad.body)).toBe(202);
      // Queued right behind it on the only crypto slot.
      const next = await s.api('POST', '/keys/decrypt', {
        token: u.token,
        form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'ok.gpg', data: ciphertext }] },
      });
      const failed = await waitJob(s.api, u.token, bad.body.job_id);
      expect(failed.state, name).toBe('failed');
      expect(failed.error.code).toBe('integrity_check_failed'); // found once decrypting: the one answer, whichever limit caught it
      expect(Date.now() - started).toBeLessThan(20_000);
      const ok = await waitJob(s.api, u.token, next.body.job_id);
      expect(ok.state, JSON.stringify(ok.error)).toBe('completed');
      expect(Buffer.compare(await download(s.api, u.token, next.body.job_id), plain)).toBe(0);
      // Nothing of the failed job is left: not its blobs, not its sealed passphrase in Redis.
      expect(await blobsOf(bad.body.job_id)).toEqual([]);
      await expect
        .poll(async () => (await s.c.jobs.queue('crypto').getJob(bad.body.job_id))?.data.payload)
        .toEqual({ job_id: bad.body.job_id, sealed_passphrase: FORGOTTEN });
    }
  }, 60_000);

  it('all outputs of one job together stay under MAX_JOB_OUTPUT_BYTES', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const files = [1, 2].map((i) => ({ name: `f${i}.bin`, data: randomBytes(2 << 20) }));
    const res = await s.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files } });
    const job = await waitJob(s.api, u.token, res.body.job_id);
    expect(job.state).toBe('failed');
    expect(job.error.code).toBe('job_output_too_large');
    expect(await blobsOf(res.body.job_id)).toEqual([]);
  });
});

describe('retention', () => {
  it('keeps decrypted plaintext for DECRYPT_RETENTION_HOURS, encrypted outputs for JOB_RETENTION_HOURS', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'r.bin', data: randomBytes(100) }]);
    const hours = (job: { finished_at: string; expires_at: string }) => (Date.parse(job.expires_at) - Date.parse(job.finished_at)) / 3600_000;
    expect(hours(enc)).toBeCloseTo(s.config.jobRetentionHours, 3);
    const res = await s.api('POST', '/keys/decrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'r.gpg', data: await download(s.api, u.token, enc.job_id) }] },
    });
    const dec = await waitJob(s.api, u.token, res.body.job_id);
    expect(dec.state).toBe('completed');
    expect(hours(dec)).toBeCloseTo(s.config.decryptRetentionHours, 3);
    expect(s.config.decryptRetentionHours).toBeLessThan(s.config.jobRetentionHours);
  });
});

describe('Idempotency-Key', () => {
  it('replays the same request, and refuses the key with other fields or other file contents (422)', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const other = await createKey(s.api, u.token, { label: 'other' });
    const data = randomBytes(1000);
    const send = (fields: Record<string, string>, file: Buffer, idem: string) =>
      s.api('POST', '/keys/encrypt', { token: u.token, headers: { 'idempotency-key': idem }, form: { ...fields, files: [{ name: 'x.bin', data: file }] } });

    const first = await send({ fingerprint: key.fingerprint }, data, 'k-1');
    expect(first.status).toBe(202);
    const again = await send({ fingerprint: key.fingerprint }, data, 'k-1');
    expect(again.body.job_id).toBe(first.body.job_id);

    const otherField = await send({ fingerprint: other.fingerprint }, data, 'k-1');
    expect(otherField.status).toBe(422);
    expect(otherField.body.code).toBe('idempotency_key_reused');
    const sameSizeOtherBytes = Buffer.from(data);
    sameSizeOtherBytes[0] ^= 1;
    const otherFile = await send({ fingerprint: key.fingerprint }, sameSizeOtherBytes, 'k-1');
    expect(otherFile.status).toBe(422);
    const otherKind = await s.api('POST', '/keys/decrypt', {
      token: u.token,
      headers: { 'idempotency-key': 'k-1' },
      form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'x.bin', data }] },
    });
    expect(otherKind.status).toBe(422);
    expect(await s.c.db('jobs').where({ user_id: u.id })).toHaveLength(1);
  });

  it('refuses files under a key first used by a request without any (422, not an error: that job has no data key)', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const headers = { 'idempotency-key': 'k-rotate' };
    const rotation = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers });
    expect(rotation.status).toBe(202); // queued (this service's worker takes no rotations): a replay needs it recorded only
    const withFiles = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      headers,
      form: { fingerprint: key.fingerprint, files: [{ name: 'x.bin', data: randomBytes(100) }] },
    });
    expect(withFiles.status).toBe(422);
    expect(withFiles.body.code).toBe('idempotency_key_reused');
  });
});

describe("another account's job", () => {
  it('is 404, and the attempt is audited for the caller as not_owner', async () => {
    const owner = await registerUser(s.api);
    const intruder = await registerUser(s.api);
    const key = await createKey(s.api, owner.token);
    const enc = await encrypt(s.api, owner.token, key.fingerprint, [{ name: 'o.bin', data: randomBytes(10) }]);
    for (const path of [`/jobs/${enc.job_id}`, `/jobs/${enc.job_id}/files/0`]) {
      const res = await s.api('GET', path, { token: intruder.token });
      expect(res.status).toBe(404);
      expect(JSON.stringify(res.body)).not.toContain('not_owner');
    }
    const rows = await s.c.db('audit_logs').where({ user_id: intruder.id, action: 'jobs.deny_access' });
    expect(rows).toHaveLength(2);
    expect(rows[0]).toMatchObject({ status: 'failure', target: enc.job_id, details: { reason: 'not_owner' } });
    expect(rows[0].request_id).toBeTruthy();
    // An id that exists nowhere is 404 too, and not audited as not_owner.
    await s.api('GET', `/jobs/${crypto.randomUUID()}`, { token: intruder.token });
    expect(await s.c.db('audit_logs').where({ user_id: intruder.id, action: 'jobs.deny_access' })).toHaveLength(2);
  });
});

describe('worker audit rows', () => {
  it("carry the request id (ours), the client's own id and the client address of the request that enqueued the job", async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const res = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      headers: { 'x-request-id': 'req-audit-origin-1' },
      form: { fingerprint: key.fingerprint, files: [{ name: 'a.bin', data: randomBytes(10) }] },
    });
    await waitJob(s.api, u.token, res.body.job_id);
    const row = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.encrypt', status: 'success' }).first();
    expect(row).toMatchObject({
      request_id: res.headers.get('x-request-id'),
      client_request_id: 'req-audit-origin-1',
      ip: expect.stringContaining('127.0.0.1'),
    });
    expect(row.request_id).toMatch(/^[0-9a-f-]{36}$/);
  });
});
