import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect } from 'node:net';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createKey, waitJob } from '../support/keys';

let s: TestService;
beforeAll(async () => {
  s = await startTestService({ env: { UPLOAD_RATE_WINDOW_SECONDS: '2', UPLOAD_MIN_BYTES_PER_SECOND: '1024', UPLOADS_PER_ACCOUNT: '2' } });
});
afterAll(async () => {
  await s?.stop();
});

/** Sends the head of an encrypt request and part of its file, then `trickle` bytes a second; resolves with what the server answered and when. */
async function slowUpload(token: string, fingerprint: string, trickle: number) {
  const boundary = 'slowupload';
  const head = `--${boundary}\r\ncontent-disposition: form-data; name="fingerprint"\r\n\r\n${fingerprint}\r\n--${boundary}\r\ncontent-disposition: form-data; name="files"; filename="a.bin"\r\ncontent-type: application/octet-stream\r\n\r\n`;
  const total = head.length + (1 << 20);
  const { port } = new URL(s.url);
  const socket = connect(Number(port), '127.0.0.1');
  const started = Date.now();
  let answer = '';
  const closed = new Promise<{ answer: string; ms: number }>((resolve) => {
    socket.on('data', (d) => (answer += d.toString()));
    socket.on('close', () => resolve({ answer, ms: Date.now() - started }));
    socket.on('error', () => undefined);
  });
  socket.write(
    `POST /api/v1/keys/encrypt HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer ${token}\r\nprefer: early-hints\r\ncontent-type: multipart/form-data; boundary=${boundary}\r\ncontent-length: ${total}\r\n\r\n`,
  );
  socket.write(head + 'x'.repeat(64 * 1024));
  const timer = setInterval(() => socket.writable && trickle && socket.write('x'.repeat(trickle)), 1000);
  const done = await Promise.race([closed, new Promise<{ answer: string; ms: number }>((resolve) => setTimeout(() => resolve({ answer, ms: -1 }), 15_000))]);
  clearInterval(timer);
  socket.destroy();
  return done;
}

/**
 * An encryption whose file arrives at `bytesPerSecond` (above the service's minimum) for `seconds`, then
 * at once: resolves with the job's id when the service has answered, and when the trickle ended.
 */
async function trickledUpload(token: string, fingerprint: string, bytesPerSecond: number, seconds: number) {
  const boundary = 'trickle';
  const head = `--${boundary}\r\ncontent-disposition: form-data; name="fingerprint"\r\n\r\n${fingerprint}\r\n--${boundary}\r\ncontent-disposition: form-data; name="files"; filename="a.bin"\r\ncontent-type: application/octet-stream\r\n\r\n`;
  const tail = `\r\n--${boundary}--\r\n`;
  const fileBytes = bytesPerSecond * (seconds + 1);
  const { port } = new URL(s.url);
  const socket = connect(Number(port), '127.0.0.1');
  let answer = '';
  const answered = new Promise<string>((resolve, reject) => {
    socket.on('data', (d) => {
      answer += d.toString();
      if (/\r\n\r\n\{.*\}/s.test(answer)) resolve(answer);
    });
    socket.on('error', reject);
  });
  socket.write(
    `POST /api/v1/keys/encrypt HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer ${token}\r\ncontent-type: multipart/form-data; boundary=${boundary}\r\ncontent-length: ${head.length + fileBytes + tail.length}\r\n\r\n${head}`,
  );
  let sent = 0;
  for (let i = 0; i < seconds; i++) {
    socket.write(Buffer.alloc(bytesPerSecond, 1));
    sent += bytesPerSecond;
    await new Promise((r) => setTimeout(r, 1000));
  }
  const trickleEnded = Date.now();
  socket.write(Buffer.concat([Buffer.alloc(fileBytes - sent, 1), Buffer.from(tail)]));
  const reply = await answered;
  socket.destroy();
  const jobId = /"job_id":"([0-9a-f-]{36})"/.exec(reply)?.[1];
  return { jobId, reply, trickleEnded };
}

describe('uploads that arrive slowly but above the minimum rate', () => {
  it("hold no crypto slot while they wait for bytes: other accounts' small jobs finish meanwhile", async () => {
    const slow = await registerUser(s.api);
    const slowKey = await createKey(s.api, slow.token);
    const other = await registerUser(s.api);
    const otherKey = await createKey(s.api, other.token);
    // Two trickles: as many as the worker's crypto slots (crypto=2).
    const trickles = [trickledUpload(slow.token, slowKey.fingerprint, 4096, 8), trickledUpload(slow.token, slowKey.fingerprint, 4096, 8)];
    await new Promise((r) => setTimeout(r, 1500));

    const finished: number[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await s.api('POST', '/keys/encrypt', {
        token: other.token,
        form: { fingerprint: otherKey.fingerprint, files: [{ name: `small${i}.txt`, data: Buffer.from('small') }] },
      });
      expect(res.status).toBe(202);
      expect((await waitJob(s.api, other.token, res.body.job_id)).state).toBe('completed');
      finished.push(Date.now());
    }

    const ended = await Promise.all(trickles);
    for (const t of ended) {
      expect(t.jobId, t.reply).toBeDefined();
      expect((await waitJob(s.api, slow.token, t.jobId!)).state).toBe('completed');
      // Every small job finished while this upload was still trickling.
      expect(Math.max(...finished)).toBeLessThan(t.trickleEnded);
    }
  });

  it('one account may have only UPLOADS_PER_ACCOUNT of them arriving at once: 429 too_many_uploads', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const trickles = [trickledUpload(u.token, key.fingerprint, 4096, 3), trickledUpload(u.token, key.fingerprint, 4096, 3)];
    await new Promise((r) => setTimeout(r, 1000));
    const third = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, files: [{ name: 'c.txt', data: Buffer.from('c') }] },
    });
    expect(third.status).toBe(429);
    expect(third.body.code).toBe('too_many_uploads');
    expect(Number(third.headers.get('retry-after'))).toBeGreaterThan(0);
    for (const t of await Promise.all(trickles)) expect((await waitJob(s.api, u.token, t.jobId!)).state).toBe('completed');
    // Once they have arrived, the account uploads again.
    const after = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, files: [{ name: 'd.txt', data: Buffer.from('d') }] },
    });
    expect(after.status).toBe(202);
  });
});

describe('an upload that the client sends too slowly', () => {
  for (const [what, trickle] of [
    ['stops', 0],
    ['trickles', 10],
  ] as const) {
    it(`${what}: answered 408 upload_too_slow within the rate window, the connection closed, and its job failed with the code`, async () => {
      const u = await registerUser(s.api);
      const key = await createKey(s.api, u.token);
      const { answer, ms } = await slowUpload(u.token, key.fingerprint, trickle);
      expect(ms, answer).toBeGreaterThan(0);
      expect(ms).toBeLessThan(10_000);
      const final = answer.slice(answer.lastIndexOf('HTTP/1.1 '));
      expect(final).toMatch(/^HTTP\/1\.1 408 /);
      expect(final).toContain('"code":"upload_too_slow"');
      const jobId = /\/api\/v1\/jobs\/([0-9a-f-]{36})/.exec(answer)?.[1];
      expect(jobId, answer).toBeDefined();
      const job = await waitJob(s.api, u.token, jobId!);
      expect([job.state, job.error?.code]).toEqual(['failed', 'upload_too_slow']);
    });
  }

  it('keeps an upload that arrives at speed', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const res = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, files: [{ name: 'a.bin', data: Buffer.alloc(8 << 20, 1) }] },
    });
    expect(res.status).toBe(202);
    expect((await waitJob(s.api, u.token, res.body.job_id)).state).toBe('completed');
  });
});
