/**
 * A file job starts while its upload still arrives (the worker follows the inputs as they
 * are written) and is answered when the upload ends; a broken upload fails the job and leaves nothing.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { request, type ClientRequest, type IncomingMessage } from 'node:http';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createKey, download, PASSPHRASE, runJob } from '../support/keys';
import { registerUser, startTestService, type TestService } from '../support/service';
import { startProcess, waitForOutput } from '../support/process';
import { startWorkers } from '../../workers/worker';

let s: TestService;

beforeAll(async () => {
  s = await startTestService();
});
afterAll(() => s?.stop());

const BOUNDARY = 'streaming-test-boundary';

/** A multipart encrypt request whose body the test writes by hand, so it can hold bytes back. */
function openUpload(token: string, fields: Record<string, string>, fileName: string, path = '/keys/encrypt', service: TestService = s) {
  const url = new URL(`/api/v1${path}`, service.url);
  const requestId = randomUUID();
  const req: ClientRequest = request(url, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${token}`,
      'content-type': `multipart/form-data; boundary=${BOUNDARY}`,
      prefer: 'early-hints',
      'x-request-id': requestId,
    },
  });
  /** The job's status URL from the 103 Early Hints the API sends once the job exists (asked for above). */
  const hinted = new Promise<string>((resolve) => req.on('information', (info) => info.statusCode === 103 && resolve(String(info.headers.link))));
  const response = new Promise<{ status: number; body: any }>((resolve, reject) => {
    req.on('response', (res: IncomingMessage) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, body: JSON.parse(Buffer.concat(parts).toString() || 'null') }));
    });
    req.on('error', reject);
  });
  for (const [k, v] of Object.entries(fields)) req.write(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="${k}"\r\n\r\n${v}\r\n`);
  req.write(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="${fileName}"\r\nContent-Type: application/octet-stream\r\n\r\n`);
  return { req, response, hinted, requestId, end: () => req.end(`\r\n--${BOUNDARY}--\r\n`) };
}

/**
 * Bytes that are not an OpenPGP message, malformed from the first byte on (bit 7 clear is no packet header):
 * random bytes alone start with a packet of an unsupported kind one time in forty.
 */
function garbage(size: number): Buffer {
  const data = randomBytes(size);
  data[0] = 0;
  return data;
}

/** Polls `probe` until it returns a value (vitest's vi.waitUntil, at the interval these jobs need). */
const until = <T>(probe: () => Promise<T | undefined>) => vi.waitUntil(probe, { timeout: 20_000, interval: 20 }) as Promise<T>;

/** The audit rows of a job's failure. */
const failureAudits = (jobId: string) =>
  s.c.db('audit_logs').where({ status: 'failure' }).whereRaw("details->>'job_id' = ?", [jobId]).select('action', 'target', 'details', 'client_request_id');

const jobOf = (userId: string) => s.c.db('jobs').where({ user_id: userId }).orderBy('created_at', 'desc').first();

describe('a job runs while its upload arrives', () => {
  it('encrypts the bytes already sent before the upload has ended, and answers when it has', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const data = randomBytes(24 << 20);
    const upload = openUpload(u.token, { fingerprint: key.fingerprint }, 'big.bin');
    upload.req.write(data.subarray(0, data.length - 1024));
    // The job is active and has read most of the file while its last KiB is still held back.
    const running = await until(async () => {
      const row = await jobOf(u.id);
      return row && row.state === 'active' && (row.progress.bytes_done ?? 0) > 8 << 20 ? row : undefined;
    });
    expect(running.uploaded_at).toBeNull();
    // `Prefer: wait` ends after its N seconds with the job as it is; for another user's job it is a 404 at once.
    const waited = await s.api('GET', `/jobs/${running.id}`, { token: u.token, headers: { prefer: 'wait=1' } });
    expect([waited.status, waited.body.state]).toEqual([200, 'active']);
    const other = await registerUser(s.api);
    const asked = Date.now();
    expect((await s.api('GET', `/jobs/${running.id}`, { token: other.token, headers: { prefer: 'wait=10' } })).status).toBe(404);
    expect(Date.now() - asked).toBeLessThan(5000);
    upload.req.write(data.subarray(data.length - 1024));
    upload.end();
    const answer = await upload.response;
    expect(answer.status).toBe(202);
    const done = await runJobDone(u.token, answer.body.job_id);
    expect(done.state).toBe('completed');
    expect(done.progress).toMatchObject({ bytes_done: data.length, bytes_total: data.length, files_done: 1, files_total: 1 });
    // The ciphertext decrypts to the bytes sent.
    const dec = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'big.bin.gpg', data: await download(s.api, u.token, done.job_id) }],
    });
    expect(Buffer.compare(await download(s.api, u.token, dec.job_id), data)).toBe(0);
  });

  it('streams the ciphertext of a running encrypt job with ?follow=true, whole once the job ends; 409 without it and for decryption', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const data = randomBytes(20 << 20);
    const upload = openUpload(u.token, { fingerprint: key.fingerprint }, 'followed.bin');
    upload.req.write(data.subarray(0, 12 << 20));
    const row = await until(async () => {
      const r = await jobOf(u.id);
      return r?.state === 'active' ? r : undefined;
    });
    // The API said where the job is before answering (103 Early Hints): the client can follow it at once.
    expect(await upload.hinted).toBe(`</api/v1/jobs/${row.id}>; rel="monitor"`);
    const plain = await s.api('GET', `/jobs/${row.id}/files/0`, { token: u.token });
    expect([plain.status, plain.body.code]).toEqual([409, 'job_not_completed']);
    expect(plain.body.detail).toMatch(/follow=true/);
    // The download starts while the upload is still open, and so while the job runs.
    const followed = fetch(`${s.url}/jobs/${row.id}/files/0?follow=true`, { headers: { authorization: `Bearer ${u.token}` } });
    const res = await followed;
    expect(res.status).toBe(200);
    expect(res.headers.get('content-length')).toBeNull();
    expect(res.headers.get('content-disposition')).toContain('followed.bin.gpg');
    const body = res.arrayBuffer();
    upload.req.write(data.subarray(12 << 20));
    upload.end();
    expect((await upload.response).status).toBe(202);
    const streamed = Buffer.from(await body);
    const done = await runJobDone(u.token, row.id);
    expect(Buffer.compare(streamed, await download(s.api, u.token, done.job_id))).toBe(0);
    const dec = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'f.gpg', data: streamed }],
    });
    expect(Buffer.compare(await download(s.api, u.token, dec.job_id), data)).toBe(0);

    // Decrypted output is released after its integrity check only: never followed.
    const decrypting = openUpload(u.token, { fingerprint: key.fingerprint, passphrase: PASSPHRASE }, 'f.gpg', '/keys/decrypt');
    decrypting.req.write(streamed.subarray(0, 4 << 20));
    const decRow = await until(async () => {
      const r = await s.c.db('jobs').where({ user_id: u.id, kind: 'decrypt', state: 'active' }).first();
      return r ?? undefined;
    });
    const refused = await s.api('GET', `/jobs/${decRow.id}/files/0?follow=true`, { token: u.token });
    expect([refused.status, refused.body.code]).toEqual([409, 'job_not_completed']);
    expect(refused.body.detail).not.toMatch(/follow=true/);
    decrypting.req.write(streamed.subarray(4 << 20));
    decrypting.end();
    expect((await decrypting.response).status).toBe(202);
    expect((await runJobDone(u.token, decRow.id)).state).toBe('completed');
  });

  it('a job that fails while its files still arrive is answered at once, and what is left of the upload is not stored', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const upload = openUpload(u.token, { fingerprint: key.fingerprint, passphrase: PASSPHRASE }, 'garbage.gpg', '/keys/decrypt');
    upload.req.write(garbage(8 << 20)); // not an OpenPGP message: the worker fails it at once
    // The answer comes while the request is still open (the client has not ended it).
    const answer = await upload.response;
    expect(upload.req.writableEnded).toBe(false);
    expect(answer.status).toBe(202);
    expect([answer.body.state, answer.body.error?.code]).toEqual(['failed', 'malformed_message']);
    upload.req.destroy();
    await until(async () => ((await s.c.blob.stat(`jobs/${answer.body.job_id}/in/0`)) === null ? true : undefined));
    // One failure, audited once: the worker's, not the broken upload's as well.
    expect(await failureAudits(answer.body.job_id)).toEqual([
      {
        action: 'keys.decrypt',
        target: key.fingerprint,
        details: { job_id: answer.body.job_id, code: 'malformed_message' },
        client_request_id: upload.requestId,
      },
    ]);
  });

  it('a job that failed first is the answer when its clean-up breaks the upload before its event is heard (never a 500)', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    // This API process hears no event (a slow hub), and the upload's write breaks once the job has failed
    // (as when the worker's clean-up deletes the job's folder under a segment being published).
    const { eventHub, blob } = s.c;
    const listen = eventHub.listen.bind(eventHub);
    const put = blob.put.bind(blob);
    eventHub.listen = async () => () => {};
    blob.put = (k, source, opts) => {
      if (!k.endsWith('/in/0')) return put(k, source, opts);
      const jobId = k.split('/')[1];
      async function* untilFailed() {
        for await (const chunk of source) {
          if ((await s.c.db('jobs').where({ id: jobId }).first())?.state === 'failed')
            throw Object.assign(new Error('ENOENT: the folder went'), { code: 'ENOENT' });
          yield chunk as Buffer;
        }
      }
      return put(k, Readable.from(untilFailed()), opts);
    };
    try {
      const upload = openUpload(u.token, { fingerprint: key.fingerprint, passphrase: PASSPHRASE }, 'garbage.gpg', '/keys/decrypt');
      upload.req.write(garbage(1 << 20)); // not an OpenPGP message: the worker fails it at once
      const row = await until(async () => ((await jobOf(u.id))?.state === 'failed' ? true : undefined));
      expect(row).toBe(true);
      upload.req.write(randomBytes(1 << 20));
      upload.end();
      const answer = await upload.response;
      expect(answer.status, JSON.stringify(answer.body)).toBe(202);
      expect([answer.body.state, answer.body.error?.code]).toEqual(['failed', 'malformed_message']);
    } finally {
      eventHub.listen = listen;
      blob.put = put;
    }
  });

  it('a job that fails while its files still arrive is answered within a poll when its end event is missed', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const { eventHub } = s.c;
    const listen = eventHub.listen.bind(eventHub);
    eventHub.listen = async () => () => {};
    try {
      const upload = openUpload(u.token, { fingerprint: key.fingerprint, passphrase: PASSPHRASE }, 'garbage.gpg', '/keys/decrypt');
      upload.req.write(garbage(1 << 20)); // not an OpenPGP message: the worker fails it at once
      const answer = await upload.response;
      expect(upload.req.writableEnded).toBe(false);
      expect([answer.status, answer.body.state, answer.body.error?.code]).toEqual([202, 'failed', 'malformed_message']);
      upload.req.destroy();
    } finally {
      eventHub.listen = listen;
    }
  });

  it('a follower of an encrypt job is cut off as soon as the job fails, also before its output has begun (409 while it was queued)', async () => {
    // No worker: the output never begins, so only the job's failure can end the follower (not JOB_IDLE_SECONDS).
    const web = await startTestService({ roles: ['web'] });
    try {
      const u = await registerUser(web.api);
      const key = await createKey(web.api, u.token);
      /** A job whose upload goes on (its input is followable after half a second), and a follower of its output. */
      const follow = async (started: boolean) => {
        const upload = openUpload(u.token, { fingerprint: key.fingerprint }, 'slow.bin', '/keys/encrypt', web);
        upload.response.catch(() => undefined);
        upload.req.write(randomBytes(100));
        const jobId = (await upload.hinted).match(/jobs\/([0-9a-f-]+)/)![1];
        await until(async () => ((await web.c.db('job_files').where({ job_id: jobId, role: 'input' }).first()) ? true : undefined));
        // As a worker that has started but not yet written does.
        if (started) await web.c.db('jobs').where({ id: jobId }).update({ state: 'active' });
        const response = fetch(`${web.url}/jobs/${jobId}/files/0?follow=true`, { headers: { authorization: `Bearer ${u.token}` } });
        const following = response.then(async (r) => ({ status: r.status, body: await r.json() }));
        following.catch(() => undefined);
        await new Promise((r) => setTimeout(r, 1000));
        const cut = Date.now();
        upload.req.destroy();
        return { jobId, response, following, cut };
      };
      // Started: nothing is produced, but the status and headers came at once; then the follower is cut off.
      const active = await follow(true);
      expect((await active.response).status).toBe(200);
      await expect(active.following).rejects.toThrow();
      expect(Date.now() - active.cut).toBeLessThan(5000);
      expect((await web.c.db('jobs').where({ id: active.jobId }).first()).error.code).toBe('upload_interrupted');
      // Asked again once the job has failed: 409, not a wait.
      expect((await web.api('GET', `/jobs/${active.jobId}/files/0?follow=true`, { token: u.token })).status).toBe(409);
      // Still queued: the follower waits for the job to start, and is answered 409 when it fails instead.
      const queued = await follow(false);
      expect(await queued.following).toMatchObject({ status: 409, body: { code: 'job_not_completed' } });
      expect(Date.now() - queued.cut).toBeLessThan(5000);
    } finally {
      await web.stop();
    }
  });

  it('a follower of a job still queued waits for it to start, past JOB_IDLE_SECONDS, and gets the whole ciphertext', async () => {
    // No worker at first: the job waits in its queue for longer than a stalled writer would be given.
    const web = await startTestService({ roles: ['web'], env: { JOB_IDLE_SECONDS: '1' } });
    try {
      const u = await registerUser(web.api);
      const key = await createKey(web.api, u.token);
      const data = randomBytes(3 << 20);
      const queued = await web.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files: [{ name: 'q.bin', data }] } });
      expect([queued.status, queued.body.state]).toEqual([202, 'queued']);
      const jobId = queued.body.job_id as string;
      const following = fetch(`${web.url}/jobs/${jobId}/files/0?follow=true`, { headers: { authorization: `Bearer ${u.token}` } }).then(async (r) => ({
        status: r.status,
        body: Buffer.from(await r.arrayBuffer()),
      }));
      following.catch(() => undefined);
      await new Promise((r) => setTimeout(r, 2500));
      const pool = await startWorkers(web.c, [{ queue: 'crypto', concurrency: 1 }]);
      try {
        const followed = await following;
        expect(followed.status).toBe(200);
        expect((await web.api('GET', `/jobs/${jobId}`, { token: u.token, headers: { prefer: 'wait=30' } })).body.state).toBe('completed');
        expect(Buffer.compare(followed.body, await download(web.api, u.token, jobId))).toBe(0);
      } finally {
        await pool.close();
      }
    } finally {
      await web.stop();
    }
  });

  it('a client cut off mid-upload fails the job (upload_interrupted) and leaves no blob', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const upload = openUpload(u.token, { fingerprint: key.fingerprint }, 'cut.bin');
    upload.response.catch(() => undefined);
    upload.req.write(randomBytes(12 << 20));
    const row = await until(async () => {
      const r = await jobOf(u.id);
      return r?.state === 'active' ? r : undefined;
    });
    upload.req.destroy();
    const failed = await until(async () => {
      const r = await s.c.db('jobs').where({ id: row.id }).first();
      return r.state === 'failed' ? r : undefined;
    });
    expect(failed.error.code).toBe('upload_interrupted');
    expect(await s.c.blob.stat(`jobs/${row.id}/in/0`)).toBeNull();
    // Audited as any failed encryption, with the request that broke.
    expect(await failureAudits(row.id)).toEqual([
      { action: 'keys.encrypt', target: key.fingerprint, details: { job_id: row.id, code: 'upload_interrupted' }, client_request_id: upload.requestId },
    ]);
    // The worker let go of it: the next job runs.
    const next = await runJob(s.api, u.token, '/keys/encrypt', { fingerprint: key.fingerprint, files: [{ name: 'next.txt', data: Buffer.from('next') }] });
    expect(next.state).toBe('completed');
  });

  it('refuses a field sent after the files (422 field_after_files): the job it started fails, nothing stays', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const upload = openUpload(u.token, { fingerprint: key.fingerprint }, 'a.txt');
    upload.req.write('hello');
    upload.req.end(`\r\n--${BOUNDARY}\r\nContent-Disposition: form-data; name="armor"\r\n\r\ntrue\r\n--${BOUNDARY}--\r\n`);
    const answer = await upload.response;
    expect([answer.status, answer.body.code]).toEqual([422, 'field_after_files']);
    const row = await jobOf(u.id);
    expect([row.state, row.error.code]).toEqual(['failed', 'field_after_files']);
    expect(await s.c.blob.stat(`jobs/${row.id}/in/0`)).toBeNull();
    expect(await failureAudits(row.id)).toEqual([
      { action: 'keys.encrypt', target: key.fingerprint, details: { job_id: row.id, code: 'field_after_files' }, client_request_id: upload.requestId },
    ]);
  });
});

async function runJobDone(token: string, jobId: string) {
  for (;;) {
    const job = await s.api('GET', `/jobs/${jobId}`, { token, headers: { prefer: 'wait=30' } });
    if (job.body.state === 'completed' || job.body.state === 'failed') return job.body;
  }
}

describe('an API and a separate worker process on one local blob folder', () => {
  it('runs many small jobs at once while their uploads arrive: the worker seals with the data key of the job row', async () => {
    // A job runs from its first file on, so its worker may write outputs before the API has stored much.
    // When data keys were files made by a job's first put, a worker that made its own sealed with a key
    // the API's inputs did not use: chunk 0 failed authentication (about one job in twenty).
    // Sixteen uploads of one account at once: more than UPLOADS_PER_ACCOUNT lets arrive by default.
    const web = await startTestService({ roles: ['web'], env: { UPLOADS_PER_ACCOUNT: '16' } });
    const worker = startProcess('worker', { ...web.env, LOG_LEVEL: 'info', WORKER_QUEUES: 'crypto=1' });
    try {
      await waitForOutput(worker, 'workers started');
      const u = await registerUser(web.api);
      const key = await createKey(web.api, u.token);
      const states: string[] = [];
      await Promise.all(
        Array.from({ length: 16 }, async () => {
          for (let i = 0; i < 4; i++) {
            const r = await web.api('POST', '/keys/encrypt', {
              token: u.token,
              headers: { prefer: 'wait=30' },
              form: { fingerprint: key.fingerprint, files: [{ name: 's.bin', data: randomBytes(1024) }] },
            });
            states.push(r.body.state === 'completed' ? 'completed' : `${r.body.state}: ${r.body.error?.code}`);
          }
        }),
      );
      expect(
        states.filter((x) => x !== 'completed'),
        worker.output().slice(-3000),
      ).toEqual([]);
    } finally {
      worker.kill('SIGKILL');
      await worker.exited;
      await web.stop();
    }
  }, 120_000);
});
