/**
 * A decrypt job of a changed message answers one error, whatever the change hit, and nothing of the
 * plaintext decrypted before the integrity check reaches the client: not its outputs (plain or followed),
 * not its progress, events, job row or logs.
 */
import { randomBytes } from 'node:crypto';
import { request, type IncomingMessage } from 'node:http';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { captureLogs } from '../support/logs';
import { createKey, download, encrypt, PASSPHRASE, runJob, waitJob } from '../support/keys';
import { registerUser, startTestService, type TestService } from '../support/service';
import { flipInnerTag, packetBody } from '../support/tamper';

let s: TestService;

beforeAll(async () => {
  s = await startTestService();
});
afterAll(() => s?.stop());

/** Plaintext that is easy to look for: lines naming `marker`. */
const plaintext = (marker: string, size: number) => Buffer.from(`${marker}\n`.repeat(Math.ceil(size / (marker.length + 1)))).subarray(0, size);

describe('a decrypt job of a changed message', () => {
  it('answers one code and one message, whatever the change hit', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 't.bin', data: randomBytes(3000) }]);
    const honest = await download(s.api, u.token, enc.job_id);
    const data = packetBody(honest, 18) + 1; // the encrypted data, after the version octet
    const flip = (at: number, mask = 0x01) => {
      const bad = Buffer.from(honest);
      bad[at] ^= mask;
      return bad;
    };
    const tampered = {
      'last octet': flip(honest.length - 1),
      'inner tag': flipInnerTag(honest),
      'inner length octet': flip(data + 19, 0x10),
      'a middle octet': flip(data + 1500, 0x80),
      'MDC header': flip(honest.length - 21),
      'cut short': honest.subarray(0, honest.length - 10),
    };
    const answers = new Map<string, string[]>();
    for (const [what, file] of Object.entries(tampered)) {
      const job = await runJob(s.api, u.token, '/keys/decrypt', {
        fingerprint: key.fingerprint,
        passphrase: PASSPHRASE,
        files: [{ name: 't.bin.gpg', data: file }],
      });
      expect(job.state, what).toBe('failed');
      const answer = JSON.stringify(job.error);
      answers.set(answer, [...(answers.get(answer) ?? []), what]);
    }
    expect([...answers], JSON.stringify([...answers])).toHaveLength(1);
    expect(JSON.parse([...answers.keys()][0]).code).toBe('integrity_check_failed');
  });

  it('offers none of its plaintext while it runs (plain or ?follow=true), nor in its progress, events or logs', { timeout: 90_000 }, async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const marker = `plaintext-${randomBytes(8).toString('hex')}`;
    const data = plaintext(marker, 24 << 20);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'p.bin', data }]);
    const ciphertext = await download(s.api, u.token, enc.job_id);
    const logs = captureLogs();
    const log = s.c.log;
    s.c.log = logs.logger('debug');
    try {
      // All but the end of the message: the worker decrypts (and stores, unpublished) what came, then waits.
      const upload = openUpload(u.token, { fingerprint: key.fingerprint, passphrase: PASSPHRASE }, 'p.bin.gpg');
      upload.req.write(ciphertext.subarray(0, 20 << 20));
      const row = await vi.waitUntil(
        async () => {
          const r = await s.c.db('jobs').where({ user_id: u.id, kind: 'decrypt' }).first();
          return r?.state === 'active' && (r.progress.bytes_done ?? 0) >= 17 << 20 ? r : undefined;
        },
        { timeout: 30_000, interval: 20 },
      );
      // Plaintext exists in the store by now (its output is being written), and none of it is offered.
      expect(await s.c.blob.stat(`jobs/${row.id}/out/0.head`)).not.toBeNull();
      const plain = await s.api('GET', `/jobs/${row.id}/files/0`, { token: u.token });
      expect([plain.status, plain.body.code]).toEqual([409, 'job_not_completed']);
      const followed = await s.api('GET', `/jobs/${row.id}/files/0?follow=true`, { token: u.token });
      expect([followed.status, followed.body.code]).toEqual([409, 'job_not_completed']);
      const view = await s.api('GET', `/jobs/${row.id}`, { token: u.token });
      expect(view.body.state).toBe('active');
      expect(view.body.result ?? null).toBeNull();
      for (const seen of [plain.body, followed.body, view.body]) expect(JSON.stringify(seen)).not.toContain(marker);

      upload.req.end(Buffer.concat([ciphertext.subarray(20 << 20), Buffer.from(`\r\n--${BOUNDARY}--\r\n`)]));
      const done = await waitJob(s.api, u.token, row.id);
      expect(done.state).toBe('completed');
      expect(Buffer.compare(await download(s.api, u.token, row.id), data)).toBe(0);
      // A changed message: the job fails, and what it publishes holds nothing decrypted.
      const bad = Buffer.from(ciphertext);
      bad[bad.length - 1] ^= 1;
      const changed = await runJob(s.api, u.token, '/keys/decrypt', {
        fingerprint: key.fingerprint,
        passphrase: PASSPHRASE,
        files: [{ name: 'c.gpg', data: bad }],
      });
      expect(changed.error.code).toBe('integrity_check_failed');
      const rows = await s.c.db('jobs').where({ user_id: u.id, kind: 'decrypt' });
      const events = await s.api('GET', '/events/history?page_size=100', { token: u.token });
      for (const text of [JSON.stringify(rows), JSON.stringify(changed), JSON.stringify(events.body), logs.output()]) expect(text).not.toContain(marker);
      expect(logs.output()).toContain(changed.job_id); // the logger did see the jobs
    } finally {
      s.c.log = log;
    }
  });

  it('a job that reaches its time limit once decrypting has begun answers the same one error', { timeout: 60_000 }, async () => {
    const t = await startTestService({ env: { JOB_TIMEOUT_SECONDS: '4' } });
    try {
      const u = await registerUser(t.api);
      const key = await createKey(t.api, u.token);
      const enc = await encrypt(t.api, u.token, key.fingerprint, [{ name: 'd.bin', data: randomBytes(3 << 20) }]);
      const ciphertext = await download(t.api, u.token, enc.job_id);
      // Most of the message, and then nothing: the job decrypts what came and waits until its deadline.
      const upload = openUpload(u.token, { fingerprint: key.fingerprint, passphrase: PASSPHRASE }, 'd.bin.gpg', t);
      upload.req.write(ciphertext.subarray(0, 2 << 20));
      const failed = await vi.waitUntil(
        async () => {
          const r = await t.c.db('jobs').where({ user_id: u.id, kind: 'decrypt' }).first();
          return r?.state === 'failed' ? r : undefined;
        },
        { timeout: 30_000, interval: 50 },
      );
      upload.req.destroy();
      const changed = await runJob(t.api, u.token, '/keys/decrypt', {
        fingerprint: key.fingerprint,
        passphrase: PASSPHRASE,
        files: [{ name: 'c.gpg', data: flipInnerTag(ciphertext) }],
      });
      expect(changed.error.code).toBe('integrity_check_failed');
      expect(failed.error).toEqual(changed.error);
    } finally {
      await t.stop();
    }
  });
});

const BOUNDARY = 'decrypt-integrity-boundary';

/** A multipart decrypt request whose body the test writes by hand, so it can hold bytes back. */
function openUpload(token: string, fields: Record<string, string>, fileName: string, service = s) {
  const req = request(new URL('/api/v1/keys/decrypt', service.url), {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': `multipart/form-data; boundary=${BOUNDARY}` },
  });
  req.on('error', () => undefined); // destroyed by the test
  req.on('response', (res: IncomingMessage) => res.resume());
  for (const [k, v] of Object.entries(fields)) req.write(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="${k}"\r\n\r\n${v}\r\n`);
  req.write(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="${fileName}"\r\nContent-Type: application/octet-stream\r\n\r\n`);
  return { req };
}
