import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFile, spawn } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { createCipheriv, createHash, randomBytes } from 'node:crypto';
import { Worker } from 'node:worker_threads';
import * as openpgp from 'openpgp';
import { invalid } from '../../lib/errors';
import { ThreadPool, threadModule } from '../../lib/thread-pool';
import { startTestService, type TestService } from '../support/service';
import { waitForOutput } from '../support/process';
import { nodeCommand, procfileCommand } from '../../bench/lib/service';

/**
 * The production build (`npm run build`, scripts/build.mjs): JavaScript that runs with plain `node`, no
 * tsx, whose roles start against a real database and find the files they read next to their sources
 * (package.json for the version, web/passkeys for the passkey page). Built into a temporary folder in the
 * project root (the output must sit beside node_modules, as dist/ does).
 */
const ROOT = resolve(import.meta.dirname, '../..');
let s: TestService;
let out: string;

beforeAll(async () => {
  out = await mkdtemp(join(ROOT, '.build-test-'));
  await promisify(execFile)(process.execPath, ['scripts/build.mjs', out], { cwd: ROOT });
  s = await startTestService({ roles: ['web'] }); // the in-process API, to compare the built one with
});
afterAll(async () => {
  await s?.stop();
  if (out) await rm(out, { recursive: true, force: true });
});

function startBuilt(role: 'web' | 'worker', env: Record<string, string>) {
  const child = spawn(process.execPath, [join(out, 'main.js'), role], {
    cwd: ROOT,
    env: { ...process.env, ...s.env, LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr.on('data', (c: Buffer) => (output += c.toString()));
  const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
  return Object.assign(child, { exited, output: () => output });
}

describe('the built service', () => {
  it('starts each role with the same environment and node flags from package.json as from the Procfile (and the bench)', async () => {
    const { scripts } = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
    const command = (script: string, role: string) => {
      const { env, flags } = nodeCommand(scripts[script].split('&&').at(-1)!, role);
      // NODE_ENV's development default is `npm start`'s own (README, Quick start), not the process's tuning.
      delete env.NODE_ENV;
      return { env, flags };
    };
    for (const role of ['web', 'worker', 'scheduler']) expect(command(role, role)).toEqual(procfileCommand(role));
    expect(command('start', 'all')).toEqual(procfileCommand('web')); // one process that serves and works: the API's
  });

  it('is plain JavaScript: one entry, lazy role chunks, no TypeScript left', async () => {
    const files = await readdir(out);
    expect(files).toContain('main.js');
    expect(files.filter((f) => f.endsWith('.ts'))).toEqual([]);
    const main = await readFile(join(out, 'main.js'), 'utf8');
    // The roles are still loaded on demand (a worker never loads the HTTP stack).
    expect(main).toMatch(/await import\("\.\/server-[A-Z0-9]+\.js"\)/);
    expect(main).toMatch(/await import\("\.\/worker-[A-Z0-9]+\.js"\)/);
    expect(main).not.toMatch(/from ["']tsx/);
  });

  it('builds the thread of the MDC check to its own file, which checks a SEIPDv1 body with node alone', async () => {
    const key = randomBytes(32);
    const prefix = randomBytes(16);
    const plain = Buffer.concat([prefix, prefix.subarray(14), randomBytes(1000), Buffer.from([0xd3, 0x14])]);
    const body = Buffer.concat([
      Buffer.from([1]),
      createCipheriv('aes-256-cfb', key, Buffer.alloc(16)).update(Buffer.concat([plain, createHash('sha1').update(plain).digest()])),
    ]);
    const verdict = async (bytes: Buffer) => {
      const thread = new Worker(join(out, 'mdc-check.js'), { workerData: { ecb: 'aes-256-ecb', key } });
      try {
        const answer = new Promise<{ ok: boolean; kind?: string }>((resolve) =>
          thread.on('message', (m: { done?: number; ok?: boolean }) => m.done === undefined && resolve(m as { ok: boolean })),
        );
        thread.postMessage(new Uint8Array(bytes));
        thread.postMessage(null);
        return await answer;
      } finally {
        await thread.terminate();
      }
    };
    expect(await verdict(body)).toEqual({ ok: true });
    const tampered = Buffer.from(body);
    tampered[500] ^= 1;
    expect(await verdict(tampered)).toMatchObject({ ok: false, kind: 'tampered' });
  });

  it('builds the untrusted-work thread to its own file, which reads a key with node alone', async () => {
    const pool = new ThreadPool({ module: threadModule(out, 'untrusted-thread'), threads: 1, maxQueued: 1, deadlineMs: 10_000 });
    try {
      const stopped = () => invalid('stopped', 'stopped');
      expect(threadModule(out, 'untrusted-thread').execArgv).toEqual([]);
      const { publicKey } = await openpgp.generateKey({ type: 'ecc', curve: 'curve25519Legacy', userIDs: [{ email: 'b@example.test' }], format: 'object' });
      expect(await pool.run('recipientKey', { armored: publicKey.armor(), now: new Date() }, stopped)).toEqual({ fingerprint: publicKey.getFingerprint() });
      expect(await pool.run('signerKey', 'not a key', stopped).catch((err: unknown) => err)).toMatchObject({ status: 422, code: 'invalid_public_key' });
    } finally {
      await pool.close();
    }
  });

  it('runs the web role with node alone: health answers 200, the passkey page and version files are found', async () => {
    const web = startBuilt('web', { PORT: '0' });
    try {
      await waitForOutput(web, '"api listening"');
      const port = (
        JSON.parse(
          web
            .output()
            .split('\n')
            .find((l) => l.includes('"api listening"'))!,
        ) as { port: number }
      ).port;
      const health = await fetch(`http://127.0.0.1:${port}/api/v1/health`);
      expect(health.status).toBe(200);
      expect(await health.json()).toMatchObject({ status: 'ok', checks: { postgres: 'up', redis: 'up' } });
      const page = await fetch(`http://127.0.0.1:${port}/passkeys/`);
      expect(page.status).toBe(200);
      expect(await page.text()).toMatch(/<html/i);
      expect((await fetch(`http://127.0.0.1:${port}/passkeys/simplewebauthn-browser.js`)).status).toBe(200);
      // The same API as the sources describe (routes, schemas, names survive bundling).
      const built = await (await fetch(`http://127.0.0.1:${port}/api/v1/openapi.json`)).json();
      expect(built).toEqual((await s.api('GET', '/openapi.json')).body);
      web.kill('SIGTERM');
      expect(await web.exited).toBe(0);
    } finally {
      web.kill('SIGKILL');
    }
  });

  it('runs the worker role and stops it cleanly on SIGTERM', async () => {
    const worker = startBuilt('worker', { WORKER_QUEUES: 'crypto=1,notify=1' });
    try {
      await waitForOutput(worker, 'workers started');
      expect(worker.output()).not.toMatch(/"level":(50|60)/); // no error or fatal line
      worker.kill('SIGTERM');
      expect(await worker.exited).toBe(0);
    } finally {
      worker.kill('SIGKILL');
    }
  });
});
