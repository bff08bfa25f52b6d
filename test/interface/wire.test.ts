/**
 * What a client written from SPEC.md alone meets on the wire: one answer per request (no informational
 * answer it did not ask for), SPEC's words for login, one rule for fields a route does not name, and
 * paths and bounds as SPEC writes them.
 */
import { randomBytes } from 'node:crypto';
import { request } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createKey } from '../support/keys';
import { registerUser, startTestService, type TestService } from '../support/service';

let s: TestService;

beforeAll(async () => {
  s = await startTestService();
});
afterAll(() => s?.stop());

const BOUNDARY = 'wire-test-boundary';

/** A multipart encrypt request through node:http, which reports every informational answer it reads. */
function encryptRaw(token: string, fingerprint: string, headers: Record<string, string> = {}) {
  const body = Buffer.concat([
    Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="fingerprint"\r\n\r\n${fingerprint}\r\n`),
    Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="a.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`),
    randomBytes(4096),
    Buffer.from(`\r\n--${BOUNDARY}--\r\n`),
  ]);
  return new Promise<{ informational: { status: number; link: string | undefined }[]; status: number; body: any }>((resolve, reject) => {
    const informational: { status: number; link: string | undefined }[] = [];
    const req = request(new URL('/api/v1/keys/encrypt', s.url), {
      method: 'POST',
      headers: {
        authorization: `Bearer ${token}`,
        'content-type': `multipart/form-data; boundary=${BOUNDARY}`,
        'content-length': String(body.length),
        ...headers,
      },
    });
    req.on('information', (info) => informational.push({ status: info.statusCode, link: info.headers.link as string | undefined }));
    req.on('response', (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('end', () => resolve({ informational, status: res.statusCode!, body: JSON.parse(Buffer.concat(parts).toString()) }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

describe('informational answers', () => {
  it('sends no 103 Early Hints unasked: the final answer is the only one', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    for (const prefer of [undefined, 'wait=5', 'respond-async']) {
      const res = await encryptRaw(u.token, key.fingerprint, prefer ? { prefer } : {});
      expect([200, 202], JSON.stringify(res.body)).toContain(res.status);
      expect(res.informational, String(prefer)).toEqual([]);
    }
  });

  it('sends 103 Early Hints naming the job to a client that asks (Prefer: early-hints)', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    for (const prefer of ['early-hints', 'wait=5, early-hints', 'Early-Hints']) {
      const res = await encryptRaw(u.token, key.fingerprint, { prefer });
      expect([200, 202], JSON.stringify(res.body)).toContain(res.status);
      expect(res.informational, prefer).toEqual([{ status: 103, link: `</api/v1/jobs/${res.body.job_id}>; rel="monitor"` }]);
    }
  });
});

describe('login by SPEC’s words: username or email plus password', () => {
  it('takes identifier, username or email, and refuses none or two of them', async () => {
    const u = await registerUser(s.api);
    for (const body of [{ identifier: u.username }, { identifier: u.email }, { username: u.username }, { email: u.email }]) {
      const res = await s.api('POST', '/auth/login', { body: { ...body, password: u.password } });
      expect([res.status, res.body.user?.user_id], JSON.stringify(body)).toEqual([200, u.id]);
    }
    const wrong = await s.api('POST', '/auth/login', { body: { email: u.email, password: 'not the password' } });
    expect(wrong.status).toBe(401);
    for (const body of [{}, { username: u.username, email: u.email }]) {
      const res = await s.api('POST', '/auth/login', { body: { ...body, password: u.password } });
      expect([res.status, res.body.errors], JSON.stringify(body)).toEqual([
        422,
        [{ path: 'body.identifier', message: 'give exactly one of identifier, username and email' }],
      ]);
    }
  });
});

describe('fields a route does not name', () => {
  it('are refused with 422 naming each, in JSON bodies, query strings and form fields, never dropped', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const share = await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint, email: 'friend@example.test' } });
    expect([share.status, share.body.code, share.body.errors]).toEqual([
      422,
      'validation_failed',
      [{ path: 'body.email', message: 'is not a field of this request' }],
    ]);
    expect((await s.api('GET', '/keys/share/', { token: u.token })).body.total).toBe(0);

    const listed = await s.api('GET', '/keys/list?environment=production&colour=blue&page=1', { token: u.token });
    expect([listed.status, listed.body.errors]).toEqual([422, [{ path: 'query.colour', message: 'is not a field of this request' }]]);

    const form = await s.api('POST', '/keys/generate-key', {
      token: u.token,
      form: { label: 'x', name: 'Ann', email: 'ann@example.test', passphrase: 'correct horse battery staple', size: '4096' },
    });
    expect([form.status, form.body.errors]).toEqual([422, [{ path: 'body.size', message: 'is not a field of this request' }]]);

    const profile = await s.api('PUT', '/profile/update', { token: u.token, body: { company_name: 'Acme', role: 'admin' } });
    expect([profile.status, profile.body.errors]).toEqual([422, [{ path: 'body.role', message: 'is not a field of this request' }]]);
  });

  it('takes env, the name SPEC’s sample uses, as environment on generate-key, in a form and in JSON', async () => {
    const u = await registerUser(s.api);
    const fields = { name: 'Ann', email: 'ann@example.test', passphrase: 'correct horse battery staple' };
    const fromForm = await s.api('POST', '/keys/generate-key', { token: u.token, form: { ...fields, label: 'form', env: 'staging' } });
    expect([fromForm.status, fromForm.body.environment], JSON.stringify(fromForm.body)).toEqual([201, 'staging']);
    const fromJson = await s.api('POST', '/keys/generate-key', { token: u.token, body: { ...fields, label: 'json', env: 'development' } });
    expect([fromJson.status, fromJson.body.environment], JSON.stringify(fromJson.body)).toEqual([201, 'development']);
    const plain = await s.api('POST', '/keys/generate-key', { token: u.token, body: { ...fields, label: 'plain' } });
    expect(plain.body.environment).toBe('production');
    const both = await s.api('POST', '/keys/generate-key', { token: u.token, body: { ...fields, label: 'both', env: 'staging', environment: 'production' } });
    expect([both.status, both.body.errors]).toEqual([422, [{ path: 'body.env', message: 'env and environment name the same field: give one' }]]);
  });
});

describe('paths and bounds as SPEC writes them', () => {
  it('serves GET /keys/share/ with and without its trailing slash', async () => {
    const u = await registerUser(s.api);
    for (const path of ['/keys/share/', '/keys/share']) {
      const res = await s.api('GET', path, { token: u.token });
      expect([res.status, res.body.total], path).toEqual([200, 0]);
    }
  });

  it('names the bound a page size crosses', async () => {
    const u = await registerUser(s.api);
    const res = await s.api('GET', '/audit-logs?page_size=1000', { token: u.token });
    expect([res.status, res.body.errors]).toEqual([422, [{ path: 'query.page_size', message: 'must be at most 100' }]]);
    const zero = await s.api('GET', '/keys/list?page_size=0', { token: u.token });
    expect(zero.body.errors).toEqual([{ path: 'query.page_size', message: 'must be at least 1' }]);
  });
});
