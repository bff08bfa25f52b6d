/**
 * A client written from SPEC.md in another language: Python `requests` (Debian python3-requests, the
 * system's python, installed by scripts/test-peers.sh) walks the README's flows and SPEC's endpoints on
 * one kept-alive session, checking that every answer is the one meant for its request
 * (test/python/spec_client.py).
 */
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestService, type TestService } from '../support/service';

let s: TestService;

beforeAll(async () => {
  s = await startTestService();
});
afterAll(() => s?.stop());

it('a Python requests client on one session gets the answer meant for each request, endpoint by endpoint', async () => {
  const script = join(import.meta.dirname, '..', 'python', 'spec_client.py');
  // The system's python, where scripts/test-peers.sh installs python3-requests (PATH may find another).
  const run = await new Promise<{ error?: string; stdout: string; stderr: string }>((resolve) => {
    execFile(
      '/usr/bin/python3',
      [script, s.url],
      { timeout: 150_000, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', PYTHONDONTWRITEBYTECODE: '1' } },
      (err, stdout, stderr) => resolve({ error: err?.message, stdout, stderr }),
    );
  });
  expect(run.error, `${run.stdout}\n${run.stderr}`).toBeUndefined();
  expect(run.stdout).toMatch(/^ok: \d+ calls on one session/m);
}, 180_000);
