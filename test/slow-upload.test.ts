import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect } from 'node:net';
import { registerUser, startTestService, type TestService } from './support/service';
import { createKey, waitJob } from './support/keys';

let s: TestService;
beforeAll(async () => {
  s = await startTestService({ env: { UPLOAD_RATE_WINDOW_SECONDS: '2', UPLOAD_MIN_BYTES_PER_SECOND: '1024' } });
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

describe('an upload that the client sends too slowly', () => {
  for (const [what, trickle] of [['stops', 0], ['trickles', 10]] as const) {
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
    const res = await s.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files: [{ name: 'a.bin', data: Buffer.alloc(8 << 20, 1) }] } });
    expect(res.status).toBe(202);
    expect((await waitJob(s.api, u.token, res.body.job_id)).state).toBe('completed');
  });
});
