import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { CLIENT_TYPES_FILE, clientTypesFor, servedDocument } from '../../client/generate-types';
import {
  ClientError,
  JobFailedError,
  Kms,
  ProblemError,
  decryptFiles,
  downloadOutputs,
  encryptFiles,
  getJob,
  rewrap,
  rotate,
  type Progress,
} from '../../client/index';
import { registerUser, startTestService, type TestService } from '../support/service';

/**
 * The client library (client/) against the real service: its committed types match the document the
 * service serves, the file helpers stream through whole jobs, errors arrive as typed problems, and the
 * retry policy (same Idempotency-Key after a network error or 503, Retry-After on 429) holds against a
 * scripted server.
 */
let s: TestService;
let dir: string;
let kms: Kms;
let fingerprint: string;
const passphrase = 'a passphrase for the client test';

beforeAll(async () => {
  s = await startTestService();
  dir = await mkdtemp(join(tmpdir(), 'kms-client-'));
  const u = await registerUser(s.api);
  kms = new Kms({ url: s.url, token: u.token });
  const key = await kms.data(kms.api.POST('/keys/generate-key', { body: { label: 'client', name: 'Client Test', email: 'client@example.test', passphrase } }));
  if (!('fingerprint' in key)) throw new Error('expected a curve25519 key at once');
  fingerprint = key.fingerprint;
});
afterAll(async () => {
  await s?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** The paths of the requests of one method `kms` sends through node:http (GET: downloads) from now on. */
function recordRequests(client: Kms, of = 'GET'): string[] {
  const paths: string[] = [];
  client.rawRequest = function (this: Kms, method, path, ...rest) {
    if (method === of) paths.push(path);
    return Kms.prototype.rawRequest.call(this, method, path, ...rest);
  };
  return paths;
}

describe('client types', () => {
  it('client/openapi.ts matches the document the service serves (run `npm run client:types` after changing a route)', async () => {
    const committed = await readFile(CLIENT_TYPES_FILE, 'utf8');
    const fresh = await clientTypesFor(await servedDocument(s.url));
    const [a, b] = [committed.split('\n'), fresh.split('\n')];
    const line = a.findIndex((l, i) => l !== b[i]);
    const where =
      line < 0
        ? `the served types have ${b.length - a.length} more lines`
        : `first difference at line ${line + 1}: ${JSON.stringify(b[line]?.trim().slice(0, 160))}`;
    expect(committed === fresh, `client/openapi.ts is stale (${where}): run \`npm run client:types\``).toBe(true);
  });
});

describe('file helpers', () => {
  it('encrypts paths and a stream, following the outputs as they are produced, and decrypts back to the same bytes', async () => {
    const plain = [randomBytes(3 << 20), Buffer.from('small file\n'), Buffer.alloc(0)];
    await writeFile(join(dir, 'a.bin'), plain[0]);
    await writeFile(join(dir, 'b.txt'), plain[1]);
    const phases = new Set<Progress['phase']>();
    let uploaded = 0;
    const gets = recordRequests(kms);
    const enc = await encryptFiles(kms, {
      fingerprint,
      files: [join(dir, 'a.bin'), { name: 'b.txt', path: join(dir, 'b.txt') }, { name: 'empty', open: () => Readable.from([]) }],
      outDir: join(dir, 'enc'),
      onProgress: (p) => {
        phases.add(p.phase);
        if (p.phase === 'upload') uploaded = p.bytes_done;
      },
    });
    expect(enc.job.state).toBe('completed');
    expect(enc.outputs.map((o) => o.name)).toEqual(['a.bin.gpg', 'b.txt.gpg', 'empty.gpg']);
    expect(enc.outputs.map((o) => o.size)).toEqual(enc.job.result!.files!.map((f) => f.size));
    // Each output was downloaded once, while the job ran (the 103 Early Hints named it during the upload).
    expect(gets).toEqual([0, 1, 2].map((n) => `/jobs/${enc.job.job_id}/files/${n}?follow=true`));
    expect(uploaded).toBe(plain[0].length + plain[1].length);
    expect(phases.has('upload') && phases.has('download')).toBe(true);
    expect(await readdir(join(dir, 'enc'))).toEqual(['a.bin.gpg', 'b.txt.gpg', 'empty.gpg']); // no .part left

    const decPhases = new Set<Progress['phase']>();
    const dec = await decryptFiles(kms, {
      fingerprint,
      passphrase,
      files: enc.outputs.map((o) => o.path),
      outDir: join(dir, 'dec'),
      waitSeconds: 0,
      onProgress: (p) => decPhases.add(p.phase),
    });
    expect(dec.outputs.map((o) => o.name)).toEqual(['a.bin', 'b.txt', 'empty']);
    for (const [i, o] of dec.outputs.entries()) expect(Buffer.compare(await readFile(o.path), plain[i])).toBe(0);
    // Without Prefer: wait the job is seen queued or processing; decrypted output is downloaded after it.
    expect(decPhases.has('queued') || decPhases.has('processing')).toBe(true);

    // Outputs are never overwritten unless asked: not by a followed download either.
    await expect(decryptFiles(kms, { fingerprint, passphrase, files: [enc.outputs[1].path], outDir: join(dir, 'dec') })).rejects.toMatchObject({
      code: 'output_exists',
    });
    await expect(encryptFiles(kms, { fingerprint, files: [join(dir, 'b.txt')], outDir: join(dir, 'enc') })).rejects.toMatchObject({ code: 'output_exists' });
    expect(await readFile(enc.outputs[1].path)).toHaveLength(enc.outputs[1].size);
    const again = await decryptFiles(kms, { fingerprint, passphrase, files: [enc.outputs[1].path], outDir: join(dir, 'dec'), overwrite: true });
    expect(await readFile(again.outputs[0].path, 'utf8')).toBe('small file\n');

    // Two outputs of one name never replace one another, even with overwrite: two inputs of one name are
    // refused before the upload, two outputs of one name (decrypted files that name the same plaintext) before
    // any download, and the job's outputs stay there to fetch one at a time.
    const posts = recordRequests(kms, 'POST');
    await expect(
      encryptFiles(kms, { fingerprint, files: [join(dir, 'b.txt'), { name: 'b.txt', path: join(dir, 'a.bin') }], outDir: join(dir, 'twice'), overwrite: true }),
    ).rejects.toMatchObject({ code: 'output_exists' });
    expect(posts).toEqual([]);
    const copy = join(dir, 'copy.gpg');
    await writeFile(copy, await readFile(enc.outputs[1].path));
    const sameName = decryptFiles(kms, { fingerprint, passphrase, files: [enc.outputs[1].path, copy], outDir: join(dir, 'twice'), overwrite: true });
    await expect(sameName).rejects.toMatchObject({ code: 'output_exists', message: expect.stringContaining('Outputs 0 and 1') });
    expect(await readdir(join(dir, 'twice')).catch(() => [])).toEqual([]);
    // A decryption's outputs take the names inside the messages: two inputs of one name are fine when those differ.
    const sameInputName = await decryptFiles(kms, {
      fingerprint,
      passphrase,
      files: [0, 1].map((i) => ({ name: 'same.gpg', path: enc.outputs[i].path })),
      outDir: join(dir, 'twice'),
    });
    expect(sameInputName.outputs.map((o) => o.name)).toEqual(['a.bin', 'b.txt']);

    // follow: false downloads after the job, as decryptions do.
    const gets2 = recordRequests(kms);
    const late = await encryptFiles(kms, { fingerprint, files: [join(dir, 'b.txt')], outDir: join(dir, 'enc-late'), follow: false });
    expect(gets2).toEqual([`/jobs/${late.job.job_id}/files/0`]);
  });

  it('keeps nothing of a followed output when the upload fails and the job with it', async () => {
    const gets = recordRequests(kms);
    let fail!: () => void;
    const failed = new Promise<void>((r) => (fail = r));
    async function* cut() {
      yield randomBytes(4 << 20);
      await failed;
      throw new Error('the source failed');
    }
    const out = join(dir, 'cut');
    const attempt = encryptFiles(kms, { fingerprint, files: [{ name: 'cut.bin', stream: Readable.from(cut()) }], outDir: out }).catch((e: unknown) => e);
    // Wait until the output is being followed and its first segment (published within 500 ms) can have arrived.
    for (let i = 0; i < 100 && gets.length === 0; i++) await new Promise((r) => setTimeout(r, 50));
    expect(gets[0]).toMatch(/\/files\/0\?follow=true$/);
    await new Promise((r) => setTimeout(r, 800));
    fail();
    expect(await attempt).toBeInstanceOf(ClientError);
    expect(await readdir(out)).toEqual([]);
  });

  it('sends a one-time stream (size unknown: chunked) and names outputs from non-ASCII names', async () => {
    const data = randomBytes(200_000);
    const enc = await encryptFiles(kms, {
      fingerprint,
      armor: true,
      files: [{ name: 'naïve résumé.txt', stream: Readable.from([data.subarray(0, 1000), data.subarray(1000)]) }],
      outDir: join(dir, 'armored'),
    });
    expect(enc.outputs[0].name).toBe('naïve résumé.txt.asc');
    expect((await readFile(enc.outputs[0].path, 'utf8')).startsWith('-----BEGIN PGP MESSAGE-----')).toBe(true);
    const dec = await decryptFiles(kms, { fingerprint, passphrase, files: [enc.outputs[0].path], outDir: join(dir, 'armored-dec') });
    expect(Buffer.compare(await readFile(dec.outputs[0].path), data)).toBe(0);
  });

  it('answers refusals as typed problems with their code, and a failed job as JobFailedError', async () => {
    await writeFile(join(dir, 'x.gpg'), randomBytes(1000));
    const wrong = await decryptFiles(kms, { fingerprint, passphrase: 'not the passphrase at all', files: [join(dir, 'x.gpg')], outDir: dir }).catch(
      (e: unknown) => e,
    );
    expect(wrong).toBeInstanceOf(ProblemError);
    expect(wrong).toMatchObject({ status: 422, code: 'wrong_passphrase' });

    const missing = await getJob(kms, '00000000-0000-4000-8000-000000000000').catch((e: unknown) => e);
    expect(missing).toMatchObject({ status: 404, code: expect.any(String) });

    // Random bytes are no OpenPGP message: refused at once (422) or a failed job, never outputs.
    const garbage = await decryptFiles(kms, { fingerprint, passphrase, files: [join(dir, 'x.gpg')], outDir: join(dir, 'garbage') }).catch((e: unknown) => e);
    expect(garbage instanceof JobFailedError || (garbage instanceof ProblemError && garbage.status === 422)).toBe(true);

    const anon = new Kms({ url: s.url, token: 'kms_pk_not-a-real-key' });
    await expect(anon.data(anon.api.GET('/keys/list', {}))).rejects.toMatchObject({ status: 401 });
  });

  it('rotates a key and waits for the rotation job', async () => {
    const before = await kms.data(kms.api.POST('/keys/get-public-key', { body: { fingerprint } }));
    const job = await rotate(kms, { fingerprint });
    expect(job).toMatchObject({ kind: 'rotate-key', state: 'completed' });
    const after = await kms.data(kms.api.POST('/keys/get-public-key', { body: { fingerprint } }));
    expect(after.key.generation).toBe(before.key.generation + 1);
    expect(after.fingerprint).not.toBe(before.fingerprint);
  });

  it('rewraps a message to the current generation', async () => {
    const plain = Buffer.from('rewrap me\n');
    await writeFile(join(dir, 'rw.txt'), plain);
    const old = await encryptFiles(kms, { fingerprint, files: [join(dir, 'rw.txt')], outDir: join(dir, 'rw-old') });
    await rotate(kms, { fingerprint });
    const wrapped = await rewrap(kms, { fingerprint, passphrase, files: [old.outputs[0].path], outDir: join(dir, 'rw-new') });
    const dec = await decryptFiles(kms, { fingerprint, passphrase, files: [wrapped.outputs[0].path], outDir: join(dir, 'rw-dec') });
    expect(Buffer.compare(await readFile(dec.outputs[0].path), plain)).toBe(0);
  });
});

describe('retry policy (against a scripted server)', () => {
  interface Seen {
    method: string;
    url: string;
    key?: string;
    bytes: number;
  }
  let server: Server;
  let seen: Seen[];
  let script: ((req: IncomingMessage, res: import('node:http').ServerResponse, n: number) => void)[];
  let url: string;
  const job = {
    job_id: '11111111-1111-4111-8111-111111111111',
    kind: 'encrypt',
    state: 'completed',
    status_url: '',
    progress: {},
    result: { files: [] },
    error: null,
    created_at: '',
    started_at: null,
    finished_at: null,
    expires_at: null,
  };

  beforeAll(async () => {
    server = createServer((req, res) => {
      const n = seen.length;
      const entry: Seen = { method: req.method!, url: req.url!, key: req.headers['idempotency-key'] as string | undefined, bytes: 0 };
      seen.push(entry);
      req.on('data', (c: Buffer) => (entry.bytes += c.length));
      (script[n] ?? script[script.length - 1])(req, res, n);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  const problem = (res: import('node:http').ServerResponse, status: number, code: string, headers: Record<string, string> = {}) =>
    res
      .writeHead(status, { 'content-type': 'application/problem+json', ...headers })
      .end(JSON.stringify({ type: `urn:kms:problem:${code}`, title: 'x', status, detail: code, code }));

  it('sends an upload again with the same Idempotency-Key after a cut connection and a 503', async () => {
    seen = [];
    script = [
      (req) => req.once('data', () => req.socket.destroy()), // cut mid-upload
      (req, res) => req.resume().on('end', () => problem(res, 503, 'unavailable', { 'retry-after': '0' })),
      (req, res) => req.resume().on('end', () => res.writeHead(202, { 'content-type': 'application/json' }).end(JSON.stringify(job))),
    ];
    await writeFile(join(dir, 'retry.bin'), randomBytes(2 << 20));
    const client = new Kms({ url, token: 't' });
    const result = await encryptFiles(client, { fingerprint: 'F'.repeat(40), files: [join(dir, 'retry.bin')], outDir: join(dir, 'retry-out') });
    expect(result.job.job_id).toBe(job.job_id);
    expect(seen.map((x) => x.method)).toEqual(['POST', 'POST', 'POST']);
    expect(new Set(seen.map((x) => x.key)).size).toBe(1);
    expect(seen[0].key).toMatch(/^kms-/);
    expect(seen[2].bytes).toBeGreaterThan(2 << 20);
  });

  it('waits for Retry-After on 429, but gives a long one back as a problem at once', async () => {
    seen = [];
    script = [
      (_req, res) => problem(res, 429, 'rate_limited', { 'retry-after': '1' }),
      (_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(job)),
    ];
    const client = new Kms({ url, token: 't' });
    const started = Date.now();
    expect((await getJob(client, job.job_id)).job_id).toBe(job.job_id);
    expect(Date.now() - started).toBeGreaterThanOrEqual(950);

    seen = [];
    script = [(_req, res) => problem(res, 429, 'rate_limited', { 'retry-after': '900' })];
    const err = await getJob(client, job.job_id).catch((e: unknown) => e);
    expect(err).toMatchObject({ status: 429, code: 'rate_limited', retryAfter: 900 });
    expect(seen).toHaveLength(1);
  });

  it('refuses to download the outputs of a job that has not completed (it lists none yet)', async () => {
    const client = new Kms({ url, token: 't' });
    await expect(downloadOutputs(client, { ...job, kind: 'encrypt', state: 'active', result: null }, { outDir: dir })).rejects.toMatchObject({
      code: 'job_not_completed',
    });
  });

  it('writes outputs inside outDir whatever names the answers give, followed or not', async () => {
    const named = (names: string[]) => ({ ...job, result: { files: names.map((name, n) => ({ n, name, size: 3, download_url: '' })) } });
    const bytes = (res: import('node:http').ServerResponse, name: string) =>
      res
        .writeHead(200, { 'content-type': 'application/octet-stream', 'content-disposition': `attachment; filename*=UTF-8''${encodeURIComponent(name)}` })
        .end('abc');
    const client = new Kms({ url, token: 't' });
    await writeFile(join(dir, 'in.txt'), 'x');
    const out = join(dir, 'names', 'out');

    // Downloaded after the job: the job's names.
    seen = [];
    script = [
      (req, res) => req.resume().on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(named(['..', '../up.gpg'])))),
      (_req, res) => bytes(res, ''),
      (_req, res) => bytes(res, ''),
    ];
    const late = await encryptFiles(client, {
      fingerprint: 'F'.repeat(40),
      files: [join(dir, 'in.txt'), { name: 'in2.txt', path: join(dir, 'in.txt') }],
      outDir: out,
      follow: false,
    });
    expect(late.outputs.map((o) => o.path)).toEqual([join(out, 'output-0'), join(out, 'up.gpg')]);

    // Followed (the 103 names the job): Content-Disposition's names, held to the job's.
    seen = [];
    script = [
      (req, res) => {
        res.writeEarlyHints({ link: `</api/v1/jobs/${job.job_id}>; rel="monitor"` });
        req
          .resume()
          .on('end', () => setTimeout(() => res.writeHead(202, { 'content-type': 'application/json' }).end(JSON.stringify(named(['../../x.gpg']))), 200));
      },
      (_req, res) => bytes(res, '../../x.gpg'),
    ];
    const followed = await encryptFiles(client, { fingerprint: 'F'.repeat(40), files: [join(dir, 'in.txt')], outDir: out });
    expect(seen.map((x) => x.url)).toEqual(['/api/v1/keys/encrypt', `/api/v1/jobs/${job.job_id}/files/0?follow=true`]);
    expect(followed.outputs.map((o) => o.path)).toEqual([join(out, 'x.gpg')]);
    expect(await readdir(join(dir, 'names'))).toEqual(['out']);
  });

  it('falls back to the download after the job when a followed download is cut (the follow itself is not retried)', async () => {
    const done = { ...job, state: 'completed', result: { files: [{ n: 0, name: 'in.txt.gpg', size: 3, download_url: '' }] } };
    seen = [];
    script = [
      (req, res) => {
        const path = req.url!;
        if (req.method === 'POST') {
          res.writeEarlyHints({ link: `</api/v1/jobs/${job.job_id}>; rel="monitor"` });
          req
            .resume()
            .on('end', () => res.writeHead(202, { 'content-type': 'application/json' }).end(JSON.stringify({ ...job, state: 'active', result: null })));
        } else if (path.endsWith('/files/0?follow=true')) {
          res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-disposition': `attachment; filename="in.txt.gpg"` });
          res.write('ab', () => setTimeout(() => req.socket.destroy(), 50)); // cut off: the job failed, or the network
        } else if (path.endsWith('/files/0')) res.writeHead(200, { 'content-type': 'application/octet-stream' }).end('abc');
        else setTimeout(() => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(done)), 300);
      },
    ];
    const client = new Kms({ url, token: 't' });
    await writeFile(join(dir, 'in.txt'), 'x');
    const out = join(dir, 'fallback');
    const result = await encryptFiles(client, { fingerprint: 'F'.repeat(40), files: [join(dir, 'in.txt')], outDir: out });
    expect(await readFile(result.outputs[0].path, 'utf8')).toBe('abc');
    expect(seen.filter((x) => x.url.includes('/files/')).map((x) => x.url)).toEqual([
      `/api/v1/jobs/${job.job_id}/files/0?follow=true`,
      `/api/v1/jobs/${job.job_id}/files/0`,
    ]);
    expect(await readdir(out)).toEqual(['in.txt.gpg']);
  });

  it('does not repeat a POST without an Idempotency-Key after a network error, nor a one-time stream', async () => {
    seen = [];
    script = [(req) => req.socket.destroy()];
    const client = new Kms({ url, token: 't' });
    await expect(client.data(client.api.POST('/auth/login', { body: { identifier: 'a', password: 'b' } }))).rejects.toBeInstanceOf(ClientError);
    expect(seen).toHaveLength(1);

    seen = [];
    script = [(req) => req.once('data', () => req.socket.destroy())];
    const err = await encryptFiles(client, {
      fingerprint: 'F'.repeat(40),
      files: [{ name: 'once', stream: Readable.from([randomBytes(1 << 20)]) }],
      outDir: dir,
    }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'not_replayable' });
    expect(seen).toHaveLength(1);
  });
});
