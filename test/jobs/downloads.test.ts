/**
 * Downloading a job's output: the API writes the file to the socket itself (releasing each chunk once
 * written, lib/single-use.ts), so what koa's body handling did for it is checked here: the whole file with
 * its length, HEAD without a body, and a file that fails to open part-way cut off rather than completed.
 */
import { randomBytes } from 'node:crypto';
import { open, readdir, stat } from 'node:fs/promises';
import { request } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createKey, encrypt } from '../support/keys';
import { registerUser, startTestService, type TestService } from '../support/service';

let s: TestService;

beforeAll(async () => {
  s = await startTestService();
});
afterAll(() => s?.stop());

/** A raw GET (or HEAD) of output 0: status, headers, the bytes received, and whether the response ended cleanly. */
function fetchOutput(token: string, jobId: string, method = 'GET') {
  return new Promise<{ status: number; length: string | undefined; body: Buffer; complete: boolean }>((resolve, reject) => {
    const req = request(new URL(`${s.url}/jobs/${jobId}/files/0`), { method, headers: { authorization: `Bearer ${token}` } }, (res) => {
      const parts: Buffer[] = [];
      const done = (complete: boolean) => resolve({ status: res.statusCode!, length: res.headers['content-length'], body: Buffer.concat(parts), complete });
      res.on('data', (chunk: Buffer) => parts.push(chunk));
      res.on('end', () => done(true));
      res.on('error', () => done(false));
    });
    req.on('error', reject);
    req.end();
  });
}

/** The largest stored file of a job's output 0 (its segment). */
async function outputSegment(jobId: string): Promise<string> {
  const dir = join(s.config.blob.url, 'jobs', jobId, 'out');
  const sized = await Promise.all((await readdir(dir)).map(async (name) => ({ path: join(dir, name), size: (await stat(join(dir, name))).size })));
  return sized.sort((a, b) => b.size - a.size)[0].path;
}

describe('downloading an output', () => {
  it('sends the whole file with its Content-Length, and HEAD the same headers without a body', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const job = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'big.bin', data: randomBytes(5 << 20) }]);
    const got = await fetchOutput(u.token, job.job_id);
    expect([got.status, got.complete]).toEqual([200, true]);
    expect(Number(got.length)).toBe(got.body.length);
    expect(got.body.length).toBeGreaterThan(5 << 20);
    // The same bytes a second time: the chunks released after the first download were its own.
    expect((await fetchOutput(u.token, job.job_id)).body.equals(got.body)).toBe(true);
    const head = await fetchOutput(u.token, job.job_id, 'HEAD');
    expect([head.status, head.length, head.body.length]).toEqual([200, got.length, 0]);
  });

  it('cuts the response off when a chunk of the stored file fails its integrity check part-way', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const job = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'big.bin', data: randomBytes(5 << 20) }]);
    const segment = await outputSegment(job.job_id);
    const file = await open(segment, 'r+');
    try {
      // Past the first sealed chunk: the download has begun, with its status and length, when this one fails.
      const at = (await file.stat()).size - 100;
      const byte = Buffer.alloc(1);
      await file.read(byte, 0, 1, at);
      await file.write(Buffer.from([byte[0] ^ 1]), 0, 1, at);
    } finally {
      await file.close();
    }
    const got = await fetchOutput(u.token, job.job_id);
    expect(got.status).toBe(200);
    expect(got.complete).toBe(false);
    expect(got.body.length).toBeLessThan(Number(got.length));
  });
});
