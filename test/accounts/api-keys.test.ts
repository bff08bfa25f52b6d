import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { startWorkers } from '../../workers/worker';
import { randomUUID } from 'node:crypto';
import { routes } from '../../api/app';
import { openApiDocument } from '../../api/route';
import { SCOPES, type Scope } from '../../lib/auth/scopes';
import { MANAGED_KEY_PREFIX, checkManagedKey, newManagedKey } from '../../lib/api-key-format';
import { hashToken } from '../../lib/tokens';
import type { Logger } from '../../lib/logger';
import { MAX_API_KEYS } from '../../lib/accounts/api-keys';
import { login, registerUser, startTestService, withClockAhead, type ManualClockFollowingTime, type TestService } from '../support/service';
import { captureLogs } from '../support/logs';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';

/**
 * Managed API keys (`kms_sk_…`): generation, listing, reading the value, rotation with a grace period,
 * revocation; authentication with scopes on every route family, the per-key rate limit, and the
 * checksum that refuses a mistyped key before the database is asked.
 */
const RATE_LIMIT = 60;
let s: TestService;
beforeAll(async () => {
  // No workers: nothing but the requests of these tests touches the database (the no-query proof).
  s = await startTestService({ roles: ['web'], env: { API_KEY_RATE_LIMIT_PER_MINUTE: String(RATE_LIMIT) } });
});
afterAll(async () => {
  await s?.stop();
});

type User = Awaited<ReturnType<typeof registerUser>>;
interface Generated {
  key_id: string;
  value: string;
  prefix: string;
  scopes: Scope[];
  status: string;
  expires_at: string | null;
  use_count: number;
}

const clock = () => s.c.clock as ManualClockFollowingTime;

async function generate(u: User, body: Record<string, unknown>): Promise<Generated> {
  const res = await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'ci', ...body } });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as Generated;
}

/** Any request; a streaming answer (SSE) is not read, only its status. */
async function call(method: string, path: string, token: string, body?: unknown) {
  const res = await fetch(s.url + path, {
    method: method.toUpperCase(), // fetch upper-cases GET/POST/… but not PATCH
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = /^application\/(problem\+)?json/.test(res.headers.get('content-type') ?? '')
    ? ((await res.json()) as { code?: string; detail?: string })
    : undefined;
  if (!json) await res.body?.cancel().catch(() => undefined);
  return { status: res.status, code: json?.code, detail: json?.detail, headers: res.headers };
}

const auditOf = async (userId: string, action: string) => s.c.db('audit_logs').where({ user_id: userId, action }).orderBy('id');

describe('managed API key format', () => {
  it('is kms_sk_ + 43 base62 characters of randomness + a 6-character checksum; every single-character typo is caught', () => {
    const values = new Set(Array.from({ length: 200 }, newManagedKey));
    expect(values.size).toBe(200);
    for (const v of values) {
      expect(v).toMatch(/^kms_sk_[0-9A-Za-z]{49}$/);
      expect(checkManagedKey(v)).toBe('ok');
    }
    const v = [...values][0];
    const alphabet = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
    for (let i = MANAGED_KEY_PREFIX.length; i < v.length; i++) {
      for (const ch of [alphabet[(alphabet.indexOf(v[i]) + 1) % 62], alphabet[(alphabet.indexOf(v[i]) + 31) % 62]]) {
        expect(checkManagedKey(v.slice(0, i) + ch + v.slice(i + 1)), `typo at ${i}`).toBe('bad_checksum');
      }
    }
    // Two neighbours swapped (the other common typo).
    const swapped = v.slice(0, 10) + v[11] + v[10] + v.slice(12);
    if (swapped !== v) expect(checkManagedKey(swapped)).toBe('bad_checksum');
    for (const bad of ['kms_sk_', v.slice(0, -1), `${v}0`, v.replace('kms_sk_', 'kms_pk_'), `${v.slice(0, 20)}-${v.slice(21)}`]) {
      expect(checkManagedKey(bad), bad).toBe('malformed');
    }
  });
});

describe('managed API keys: management', () => {
  it('generates a key (value once in the answer, readable again by id and audited), lists metadata only', async () => {
    const u = await registerUser(s.api);
    const before = Date.now();
    const key = await generate(u, { name: 'deploy bot', scopes: ['keys:read', 'keys:read', 'account:read'], expires_in_days: 30 });
    expect(key.value.startsWith('kms_sk_')).toBe(true);
    expect(checkManagedKey(key.value)).toBe('ok');
    expect(key).toMatchObject({
      name: 'deploy bot',
      prefix: key.value.slice(0, 13),
      scopes: ['keys:read', 'account:read'],
      status: 'active',
      use_count: 0,
      last_used_at: null,
      revoked_at: null,
    });
    expect(Date.parse(key.expires_at!) - before).toBeGreaterThanOrEqual(30 * 86400_000 - 5000);
    expect(Date.parse(key.expires_at!) - before).toBeLessThanOrEqual(30 * 86400_000 + 5000);

    const at = new Date(Date.now() + 3 * 86400_000).toISOString();
    const second = await generate(u, { name: 'no expiry', scopes: ['audit:read'] });
    expect(second.expires_at).toBeNull();
    const third = await generate(u, { name: 'until', scopes: ['audit:read'], expires_at: at });
    expect(third.expires_at).toBe(at);

    const list = await s.api('GET', '/api-keys?page_size=2', { token: u.token });
    expect(list.status).toBe(200);
    expect(list.body).toMatchObject({ page: 1, page_size: 2, total: 3 });
    expect(list.body.items.map((k: { key_id: string }) => k.key_id)).toEqual([third.key_id, second.key_id]);
    const all = await s.api('GET', '/api-keys', { token: u.token });
    for (const k of [key, second, third]) expect(JSON.stringify(all.body)).not.toContain(k.value);
    expect(all.body.items[2]).toMatchObject({ key_id: key.key_id, prefix: key.prefix, scopes: ['keys:read', 'account:read'], status: 'active', use_count: 0 });
    expect(all.body.items[2]).not.toHaveProperty('value');

    const one = await s.api('GET', `/api-keys/${key.key_id}`, { token: u.token });
    expect(one.status).toBe(200);
    expect(one.body).toMatchObject({ key_id: key.key_id, value: key.value, status: 'active' });
    expect(one.headers.get('cache-control')).toBe('no-store');
    const reads = await auditOf(u.id, 'api_keys.read_value');
    expect(reads.map((r) => r.target)).toEqual([key.key_id]);
    expect((await auditOf(u.id, 'api_keys.create')).map((r) => r.target).sort()).toEqual([key.key_id, second.key_id, third.key_id].sort());
  });

  it('refuses bad input with 422', async () => {
    const u = await registerUser(s.api);
    const past = new Date(Date.now() - 60_000).toISOString();
    const bad: Record<string, unknown>[] = [
      { scopes: ['keys:read'] }, // no name
      { name: '', scopes: ['keys:read'] },
      { name: 'a\nb', scopes: ['keys:read'] },
      { name: 'x'.repeat(101), scopes: ['keys:read'] },
      { name: 'x' }, // no scopes
      { name: 'x', scopes: [] },
      { name: 'x', scopes: ['keys:admin'] },
      { name: 'x', scopes: 'keys:read' },
      { name: 'x', scopes: ['keys:read'], expires_in_days: 0 },
      { name: 'x', scopes: ['keys:read'], expires_in_days: 1.5 },
      { name: 'x', scopes: ['keys:read'], expires_at: 'tomorrow' },
      { name: 'x', scopes: ['keys:read'], expires_at: past },
      { name: 'x', scopes: ['keys:read'], expires_at: new Date(Date.now() + 3651 * 86400_000).toISOString() },
      { name: 'x', scopes: ['keys:read'], expires_in_days: 3651 },
      { name: 'x', scopes: ['keys:read'], expires_in_days: 3, expires_at: new Date(Date.now() + 86400_000).toISOString() },
    ];
    for (const body of bad) {
      const res = await s.api('POST', '/api-keys/generate', { token: u.token, body });
      expect(res.status, JSON.stringify(body)).toBe(422);
      expect(res.body.code).toBe('validation_failed');
    }
    expect((await s.api('GET', '/api-keys/not-a-uuid', { token: u.token })).status).toBe(422);
    expect((await s.api('GET', '/api-keys?status=gone', { token: u.token })).status).toBe(422);
    const key = await generate(u, { scopes: ['keys:read'] });
    for (const body of [{ grace_seconds: -1 }, { grace_seconds: 7 * 86400 + 1 }, { grace_seconds: 'soon' }]) {
      expect((await s.api('POST', `/api-keys/${key.key_id}/rotate`, { token: u.token, body })).status, JSON.stringify(body)).toBe(422);
    }
    expect((await s.api('GET', '/api-keys', { token: u.token })).body.total).toBe(1);
  });

  it("answers 404 for another account's key on every endpoint, and audits the attempt", async () => {
    const ann = await registerUser(s.api);
    const eve = await registerUser(s.api);
    const key = await generate(ann, { scopes: ['keys:read'] });
    for (const [method, path, body] of [
      ['GET', '', undefined],
      ['POST', '/rotate', {}],
      ['DELETE', '', undefined],
    ] as const) {
      const res = await s.api(method, `/api-keys/${key.key_id}${path}`, { token: eve.token, body });
      expect(res.status, `${method} ${path}`).toBe(404);
      expect(res.body.code).toBe('api_key_not_found');
      expect(JSON.stringify(res.body)).not.toContain(key.value);
    }
    expect((await s.api('GET', `/api-keys/${randomUUID()}`, { token: eve.token })).status).toBe(404);
    expect((await s.api('GET', '/api-keys', { token: eve.token })).body.total).toBe(0);
    expect(await auditOf(eve.id, 'api_keys.deny_access')).toHaveLength(3);
    // Nothing changed for the owner.
    expect((await s.api('GET', `/api-keys/${key.key_id}`, { token: ann.token })).body).toMatchObject({ status: 'active', value: key.value });
    expect(await call('GET', '/keys/list', key.value)).toMatchObject({ status: 200 });
  });

  it('holds the per-account limit under parallel requests', async () => {
    const u = await registerUser(s.api);
    const results = await Promise.all(
      Array.from({ length: MAX_API_KEYS + 5 }, (_, i) =>
        s.api('POST', '/api-keys/generate', { token: u.token, body: { name: `k${i}`, scopes: ['keys:read'] } }),
      ),
    );
    expect(results.filter((r) => r.status === 201)).toHaveLength(MAX_API_KEYS);
    const refused = results.filter((r) => r.status !== 201);
    expect(refused.map((r) => `${r.status} ${r.body.code}`)).toEqual(Array(5).fill('409 api_key_limit_reached'));
    // A revoked key makes room.
    const first = results.find((r) => r.status === 201)!.body as Generated;
    expect((await s.api('DELETE', `/api-keys/${first.key_id}`, { token: u.token })).status).toBe(204);
    await generate(u, { scopes: ['keys:read'] });
  });
});

describe('managed API keys: authentication', () => {
  it('authenticates on routes within its scopes; a missing scope is 403 insufficient_scope naming it; use is counted', async () => {
    const u = await registerUser(s.api);
    const reader = await generate(u, { scopes: ['keys:read', 'account:read'] });
    const writer = await generate(u, { scopes: ['keys:write'] });
    const crypto = await generate(u, { scopes: ['crypto:encrypt'] });
    const jobs = await generate(u, { scopes: ['jobs:read'] });

    const me = await s.api('GET', '/auth/me', { token: reader.value });
    expect(me.status).toBe(200);
    expect(me.body).toMatchObject({ user_id: u.id, authenticated_via: 'api_key' });
    expect((await s.api('GET', '/keys/list', { token: reader.value })).status).toBe(200);

    const refused = await s.api('POST', '/keys/generate-key', {
      token: reader.value,
      form: { label: 'x', name: 'A', email: 'a@example.test', passphrase: 'correct horse battery staple' },
    });
    expect(refused.status).toBe(403);
    expect(refused.body.code).toBe('insufficient_scope');
    expect(refused.body.detail).toContain('keys:write');
    expect(refused.headers.get('www-authenticate')).toBe('Bearer realm="kms", error="insufficient_scope", scope="keys:write"');
    const denied = await auditOf(u.id, 'sessions.deny');
    expect(denied.at(-1)).toMatchObject({
      status: 'failure',
      target: '/api/v1/keys/generate-key',
      details: { reason: 'insufficient_scope', scope: 'keys:write', api_key_id: reader.key_id },
    });

    const key = await createKey(s.api, writer.value);
    expect((await s.api('GET', '/keys/list', { token: writer.value })).body.code).toBe('insufficient_scope');
    expect((await s.api('GET', '/keys/list', { token: reader.value })).body.items.map((k: { fingerprint: string }) => k.fingerprint)).toEqual([
      key.fingerprint,
    ]);

    const job = await s.api('POST', '/keys/encrypt', {
      token: crypto.value,
      form: { fingerprint: key.fingerprint, files: [{ name: 'a.txt', data: Buffer.from('hello') }] },
    });
    expect(job.status, JSON.stringify(job.body)).toBe(202);
    const decrypt = await s.api('POST', '/keys/decrypt', {
      token: crypto.value,
      form: { fingerprint: key.fingerprint, passphrase: 'x', files: [{ name: 'a.gpg', data: Buffer.from('x') }] },
    });
    expect(decrypt.body.detail).toContain('crypto:decrypt');
    expect((await s.api('GET', `/jobs/${job.body.job_id}`, { token: crypto.value })).body.detail).toContain('jobs:read');
    // jobs:read reads the jobs the key itself submitted, not another credential's.
    expect((await s.api('GET', `/jobs/${job.body.job_id}`, { token: jobs.value })).status).toBe(404);

    // Partner keys keep their full access, sessions too.
    expect((await s.api('GET', `/jobs/${job.body.job_id}`, { token: u.apiKey })).status).toBe(200);
    expect((await s.api('GET', '/auth/me', { token: u.apiKey })).body.authenticated_via).toBe('partner_key');

    const list = (await s.api('GET', '/api-keys', { token: u.token })).body.items as (Generated & { last_used_at: string | null })[];
    const byId = new Map(list.map((k) => [k.key_id, k]));
    expect(byId.get(reader.key_id)).toMatchObject({ use_count: 4 });
    expect(byId.get(jobs.key_id)).toMatchObject({ use_count: 1 });
    expect(byId.get(writer.key_id)).toMatchObject({ use_count: 2 });
    expect(byId.get(crypto.key_id)).toMatchObject({ use_count: 3 });
    expect(Date.now() - Date.parse(byId.get(reader.key_id)!.last_used_at!)).toBeLessThan(60_000);
  });

  it("reads only the jobs the key submitted, never a session's or another key's; a session reads every job of the account", async () => {
    const pool = await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
    onTestFinished(() => pool.close());
    const u = await registerUser(s.api);
    const mine = await generate(u, { scopes: ['crypto:encrypt', 'jobs:read'] });
    const other = await generate(u, { scopes: ['crypto:encrypt', 'jobs:read'] });
    const key = await createKey(s.api, u.token);
    const ciphertext = await download(
      s.api,
      u.token,
      (await encrypt(s.api, u.token, key.fingerprint, [{ name: 'a.txt', data: Buffer.from('secret') }])).job_id,
    );
    // A session's decryption: its plaintext output is the session's alone.
    const decrypted = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'a.txt.gpg', data: ciphertext }],
    });
    expect(decrypted.state).toBe('completed');
    const own = await encrypt(s.api, mine.value, key.fingerprint, [{ name: 'b.txt', data: Buffer.from('hello') }]);

    for (const path of [`/jobs/${decrypted.job_id}`, `/jobs/${decrypted.job_id}/files/0`, `/jobs/${own.job_id}`, `/jobs/${own.job_id}/files/0`]) {
      const res = await s.api('GET', path, { token: other.value });
      expect([res.status, res.body.code], path).toEqual([404, 'job_not_found']);
    }
    expect((await s.api('GET', `/jobs/${decrypted.job_id}/files/0`, { token: mine.value })).status).toBe(404);
    expect((await s.api('GET', `/jobs/${own.job_id}`, { token: mine.value })).body).toMatchObject({ job_id: own.job_id, state: 'completed' });
    expect((await download(s.api, mine.value, own.job_id)).length).toBeGreaterThan(0);
    // The session and the partner key read every job of the account.
    for (const token of [u.token, u.apiKey]) expect((await s.api('GET', `/jobs/${own.job_id}`, { token })).status).toBe(200);
    expect((await auditOf(u.id, 'jobs.deny_access')).length).toBeGreaterThanOrEqual(4);

    // An Idempotency-Key another credential used is not a way to read that credential's job.
    const body = { fingerprint: key.fingerprint, files: [{ name: 'c.txt', data: Buffer.from('same') }] };
    const first = await s.api('POST', '/keys/encrypt', { token: u.token, form: body, headers: { 'idempotency-key': 'shared-key-1' } });
    expect(first.status).toBe(202);
    const replay = await s.api('POST', '/keys/encrypt', { token: other.value, form: body, headers: { 'idempotency-key': 'shared-key-1' } });
    expect([replay.status, replay.body.code]).toEqual([422, 'idempotency_key_reused']);
    expect(JSON.stringify(replay.body)).not.toContain(first.body.job_id);
  });

  it('counts the plaintext bytes of the jobs a key submits, once per completed job', async () => {
    // This file's service runs no workers (jobs stay queued elsewhere): one for this test.
    const pool = await startWorkers(s.c, [{ queue: 'crypto', concurrency: 1 }]);
    onTestFinished(() => pool.close());
    const u = await registerUser(s.api);
    const worker = await generate(u, { scopes: ['crypto:encrypt', 'crypto:decrypt', 'jobs:read'] });
    const key = await createKey(s.api, u.token);
    const data = Buffer.alloc(12_345, 7);
    const encrypted = await encrypt(s.api, worker.value, key.fingerprint, [
      { name: 'a.bin', data },
      { name: 'b.bin', data: data.subarray(0, 100) },
    ]);
    const ciphertext = await download(s.api, worker.value, encrypted.job_id, 0);
    const decrypted = await runJob(s.api, worker.value, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'a.bin.gpg', data: ciphertext }],
    });
    expect(decrypted.state).toBe('completed');
    // A session's jobs count for no key.
    await encrypt(s.api, u.token, key.fingerprint, [{ name: 'c.bin', data }]);
    const listed = ((await s.api('GET', '/api-keys', { token: u.token })).body.items as { key_id: string }[]).find((k) => k.key_id === worker.key_id);
    expect(listed).toMatchObject({ bytes_encrypted: 12_445, bytes_decrypted: ciphertext.length });
  });

  it('never opens session-only or admin routes (403 session_required), managing API keys included', async () => {
    const u = await registerUser(s.api);
    const all = await generate(u, { scopes: [...SCOPES] });
    const other = await generate(u, { scopes: ['keys:read'] });
    const tried = [
      ['POST', '/api-keys/generate', { name: 'x', scopes: ['keys:read'] }],
      ['GET', '/api-keys', undefined],
      ['GET', `/api-keys/${other.key_id}`, undefined],
      ['POST', `/api-keys/${other.key_id}/rotate`, {}],
      ['DELETE', `/api-keys/${other.key_id}`, undefined],
      ['POST', '/auth/logout', undefined],
      ['POST', '/partners/rotate-api-key', undefined],
      ['POST', '/profile/change-password', { current_password: u.password, new_password: 'another long password' }],
      ['POST', '/profile/delete-account', { password: u.password }],
      ['GET', '/status', undefined],
    ] as const;
    for (const [method, path, body] of tried) {
      const res = await call(method, path, all.value, body);
      expect([res.status, res.code], `${method} ${path}`).toEqual([403, 'session_required']);
    }
    // The partner key is refused on the API-key routes too: they need a session.
    expect((await call('GET', '/api-keys', u.apiKey)).code).toBe('session_required');
    expect((await call('POST', '/api-keys/generate', u.apiKey, { name: 'x', scopes: ['keys:read'] })).code).toBe('session_required');
    // Nothing happened: the other key is untouched, and the account still logs in with its password.
    expect((await s.api('GET', `/api-keys/${other.key_id}`, { token: u.token })).body).toMatchObject({ status: 'active', value: other.value });
    expect((await s.api('GET', '/api-keys', { token: u.token })).body.total).toBe(2);
    await login(s.api, u);
    expect((await auditOf(u.id, 'sessions.deny')).filter((r) => r.details.reason === 'session_required').length).toBeGreaterThanOrEqual(tried.length);
  });

  it('revokes at once; a revoked key answers 401 api_key_revoked; revoking again is harmless', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u, { scopes: ['keys:read'] });
    expect((await call('GET', '/keys/list', key.value)).status).toBe(200);
    const results = await Promise.all(Array.from({ length: 5 }, () => s.api('DELETE', `/api-keys/${key.key_id}`, { token: u.token })));
    expect(results.map((r) => r.status)).toEqual([204, 204, 204, 204, 204]);
    expect(await auditOf(u.id, 'api_keys.revoke')).toHaveLength(1);

    const used = await call('GET', '/keys/list', key.value);
    expect(used).toMatchObject({ status: 401, code: 'api_key_revoked' });
    expect(used.headers.get('www-authenticate')).toBe('Bearer realm="kms", error="invalid_token"');
    expect((await auditOf(u.id, 'sessions.deny')).at(-1)!.details).toMatchObject({ reason: 'api_key_revoked', api_key_id: key.key_id });

    const one = await s.api('GET', `/api-keys/${key.key_id}`, { token: u.token });
    expect(one.body).toMatchObject({ status: 'revoked', value: null });
    expect(one.body.revoked_at).toBeTruthy();
    expect((await s.c.db('api_keys').where({ id: key.key_id }).first()).value_sealed).toBeNull();
    const rotate = await s.api('POST', `/api-keys/${key.key_id}/rotate`, { token: u.token, body: {} });
    expect(rotate).toMatchObject({ status: 409, body: { code: 'api_key_revoked' } });
    expect((await s.api('GET', '/api-keys?status=revoked', { token: u.token })).body.items.map((k: Generated) => k.key_id)).toEqual([key.key_id]);
    expect((await s.api('GET', '/api-keys?status=active', { token: u.token })).body.total).toBe(0);

    const events = (await s.api('GET', '/events/history?types=api_keys.created,api_keys.revoked', { token: u.token })).body.items as {
      type: string;
      data: Record<string, unknown>;
    }[];
    expect(events.map((e) => [e.type, e.data.key_id])).toEqual([
      ['api_keys.revoked', key.key_id],
      ['api_keys.created', key.key_id],
    ]);
  });

  it('stops working when the account is deleted', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u, { scopes: ['account:read'] });
    expect((await call('GET', '/auth/me', key.value)).status).toBe(200);
    expect((await s.api('POST', '/profile/delete-account', { token: u.token, body: { password: u.password } })).status).toBeLessThan(300);
    expect(await call('GET', '/auth/me', key.value)).toMatchObject({ status: 401, code: 'invalid_api_key' });
  });

  it('rotates: the old value works until its grace period ends (then 401 api_key_rotated), the new one at once', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u, { scopes: ['keys:read'] });
    const before = Date.now();
    const rotated = await s.api('POST', `/api-keys/${key.key_id}/rotate`, { token: u.token, body: { grace_seconds: 3600 } });
    expect(rotated.status).toBe(200);
    const next = rotated.body as Generated & { previous_value_expires_at: string };
    expect(next.key_id).toBe(key.key_id);
    expect(next.value).not.toBe(key.value);
    expect(checkManagedKey(next.value)).toBe('ok');
    expect(next.prefix).toBe(next.value.slice(0, 13));
    expect(Math.abs(Date.parse(next.previous_value_expires_at) - (before + 3600_000))).toBeLessThan(5000);
    expect((await s.api('GET', `/api-keys/${key.key_id}`, { token: u.token })).body.value).toBe(next.value);

    expect((await call('GET', '/keys/list', key.value)).status).toBe(200);
    expect((await call('GET', '/keys/list', next.value)).status).toBe(200);
    await withClockAhead(clock(), 3600_000 - 60_000, async () => {
      expect((await call('GET', '/keys/list', key.value)).status).toBe(200);
    });
    await withClockAhead(clock(), 3600_000 + 1000, async () => {
      const old = await call('GET', '/keys/list', key.value);
      expect(old).toMatchObject({ status: 401, code: 'api_key_rotated' });
      expect(old.headers.get('www-authenticate')).toContain('error="invalid_token"');
      expect((await call('GET', '/keys/list', next.value)).status).toBe(200);
    });

    // Without a grace period the replaced value stops at once; the one replaced earlier keeps its own end.
    const third = (await s.api('POST', `/api-keys/${key.key_id}/rotate`, { token: u.token, body: {} })).body as Generated & {
      previous_value_expires_at: string;
    };
    expect(Date.parse(third.previous_value_expires_at)).toBeLessThanOrEqual(Date.now());
    expect(await call('GET', '/keys/list', next.value)).toMatchObject({ status: 401, code: 'api_key_rotated' });
    expect((await call('GET', '/keys/list', key.value)).status).toBe(200);
    expect((await call('GET', '/keys/list', third.value)).status).toBe(200);

    // Counters belong to the key, whatever value was used.
    const listed = (await s.api('GET', '/api-keys', { token: u.token })).body.items[0];
    expect(listed).toMatchObject({ key_id: key.key_id, use_count: 6, prefix: third.prefix });
    expect(listed.last_rotated_at).toBeTruthy();
    expect(await auditOf(u.id, 'api_keys.rotate')).toHaveLength(2);
    const events = (await s.api('GET', '/events/history?types=api_keys.rotated', { token: u.token })).body.items as { data: Record<string, unknown> }[];
    expect(events).toHaveLength(2);
    expect(events[1].data).toEqual({ key_id: key.key_id, previous_value_expires_at: next.previous_value_expires_at });
    // Revocation ends every value at once, grace or not.
    await s.api('DELETE', `/api-keys/${key.key_id}`, { token: u.token });
    expect((await call('GET', '/keys/list', key.value)).code).toBe('api_key_revoked');
    expect((await call('GET', '/keys/list', third.value)).code).toBe('api_key_revoked');
  });

  it('expires: 401 api_key_expired after expires_at; it cannot be rotated back to life', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u, { scopes: ['keys:read'], expires_in_days: 1 });
    expect((await call('GET', '/keys/list', key.value)).status).toBe(200);
    await withClockAhead(clock(), 86400_000 + 1000, async () => {
      expect(await call('GET', '/keys/list', key.value)).toMatchObject({ status: 401, code: 'api_key_expired' });
      const token = await login(s.api, u);
      expect((await s.api('GET', '/api-keys', { token })).body.items[0]).toMatchObject({ key_id: key.key_id, status: 'expired' });
      expect((await s.api('GET', '/api-keys?status=expired', { token })).body.total).toBe(1);
      expect((await s.api('GET', '/api-keys?status=active', { token })).body.total).toBe(0);
      expect((await s.api('POST', `/api-keys/${key.key_id}/rotate`, { token, body: {} })).body.code).toBe('api_key_expired');
    });
    expect((await call('GET', '/keys/list', key.value)).status).toBe(200);
  });

  it('refuses a value with a bad checksum without a database query (401 invalid_api_key)', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u, { scopes: ['keys:read'] });
    const i = 20;
    const typo = key.value.slice(0, i) + (key.value[i] === 'a' ? 'b' : 'a') + key.value.slice(i + 1);
    expect(checkManagedKey(typo)).toBe('bad_checksum');

    // Only the credential tables are watched: timers of the same process (the event relay's outbox sweep,
    // the keyring's reload, the flush of earlier keys' use counts) query on their own schedule, and their
    // queries are not the request's.
    const queries: string[] = [];
    const spy = (q: { sql: string }) => {
      if (/api_key|\busers\b/.test(q.sql) && !/"use_count" = use_count \+/.test(q.sql)) queries.push(q.sql);
    };
    s.c.db.on('query', spy);
    try {
      for (const bad of [typo, 'kms_sk_short', `${key.value}x`]) {
        queries.length = 0;
        const res = await call('GET', '/keys/list', bad);
        expect(res, bad).toMatchObject({ status: 401, code: 'invalid_api_key' });
        expect(res.headers.get('www-authenticate')).toBe('Bearer realm="kms", error="invalid_token"');
        expect(queries, bad).toEqual([]);
      }
      // The spy sees queries: a well-formed value that was never issued is looked up (and refused).
      queries.length = 0;
      expect(await call('GET', '/keys/list', newManagedKey())).toMatchObject({ status: 401, code: 'invalid_api_key' });
      expect(queries.some((q) => q.includes('api_key_secrets'))).toBe(true);
    } finally {
      s.c.db.off('query', spy);
    }
  });

  it('limits requests per key: exactly the limit passes under parallel requests, then 429 with Retry-After', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u, { scopes: ['account:read'] });
    const other = await generate(u, { scopes: ['account:read'] });
    const results = await Promise.all(Array.from({ length: RATE_LIMIT + 15 }, () => call('GET', '/auth/me', key.value)));
    expect(results.filter((r) => r.status === 200)).toHaveLength(RATE_LIMIT);
    const limited = results.filter((r) => r.status !== 200);
    expect(limited).toHaveLength(15);
    for (const r of limited) {
      expect(r.status).toBe(429);
      expect(r.code).toBe('rate_limited');
      const retry = Number(r.headers.get('retry-after'));
      expect(retry).toBeGreaterThanOrEqual(1);
      expect(retry).toBeLessThanOrEqual(60);
    }
    // Another key of the same account has its own budget; refused requests were not counted as use.
    expect((await call('GET', '/auth/me', other.value)).status).toBe(200);
    const listed = (await s.api('GET', '/api-keys', { token: u.token })).body.items as Generated[];
    expect(listed.find((k) => k.key_id === key.key_id)!.use_count).toBe(RATE_LIMIT);
    // A rotated value shares the key's budget.
    const rotated = (await s.api('POST', `/api-keys/${key.key_id}/rotate`, { token: u.token, body: {} })).body as Generated;
    expect((await call('GET', '/auth/me', rotated.value)).status).toBe(429);
  });
});

describe('scopes on every route', () => {
  it('every route an API key can reach names a known scope; session and admin routes name none', () => {
    for (const def of routes) {
      if (def.access === 'auth') expect(SCOPES, `${def.method} ${def.path}`).toContain(def.scope);
      else expect(def.scope, `${def.method} ${def.path}`).toBeUndefined();
    }
    expect(routes.filter((r) => r.path.startsWith('/api-keys') && !r.path.startsWith('/api-keys/shared/')).every((r) => r.access === 'session')).toBe(true);
  });

  it("the OpenAPI document names each route's scope in its security requirement and description", () => {
    const doc = openApiDocument(routes, { title: 't', version: '1', serverUrl: 'http://localhost/api/v1' }) as unknown as {
      paths: Record<string, Record<string, { security?: unknown; description?: string }>>;
    };
    for (const def of routes) {
      const op = doc.paths[def.path][def.method];
      if (def.access === 'public') expect(op.security, def.path).toEqual([]);
      else expect(op.security, def.path).toEqual([{ bearer: def.access === 'auth' ? [def.scope] : [] }]);
      if (def.access === 'auth') expect(op.description, def.path).toContain(`\`${def.scope}\``);
    }
    expect(doc.paths['/api-keys'].get.description).toContain('API keys are refused');
  });

  it('each route family refuses a key without its scope and lets a key with it through', async () => {
    const u = await registerUser(s.api);
    const keys = new Map<Scope, string>();
    for (const scope of SCOPES) keys.set(scope, (await generate(u, { name: scope, scopes: [scope] })).value);
    const everything = (await generate(u, { name: 'all', scopes: [...SCOPES] })).value;
    const fill = (path: string) =>
      path.replace(/\{(\w+)\}/g, (_, name: string) =>
        name === 'fingerprint' ? 'a'.repeat(40) : name === 'n' ? '0' : name.endsWith('_id') ? randomUUID() : 'x'.repeat(43),
      );
    const families = new Set<Scope>();
    for (const def of routes) {
      if (def.access === 'public') continue;
      const path = fill(def.path);
      const body = ['post', 'put', 'patch'].includes(def.method) ? {} : undefined;
      const label = `${def.method.toUpperCase()} ${def.path}`;
      if (def.access !== 'auth') {
        const res = await call(def.method, path, everything, body);
        expect([res.status, res.code], label).toEqual([403, 'session_required']);
        continue;
      }
      const scope = def.scope!;
      families.add(scope);
      // Refused by a key holding another single scope (spread over the keys: each has its own rate budget).
      const without = SCOPES[(SCOPES.indexOf(scope) + 1 + (families.size % (SCOPES.length - 1))) % SCOPES.length];
      const refused = await call(def.method, path, keys.get(without)!, body);
      expect([refused.status, refused.code], label).toEqual([403, 'insufficient_scope']);
      expect(refused.detail, label).toContain(scope);
      const allowed = await call(def.method, path, keys.get(scope)!, body);
      expect([401, 403, 429], `${label}: ${allowed.status} ${allowed.code}`).not.toContain(allowed.status);
      expect(allowed.status, label).toBeLessThan(500);
    }
    for (const family of [
      'keys:read',
      'keys:write',
      'crypto:encrypt',
      'crypto:decrypt',
      'jobs:read',
      'audit:read',
      'events:read',
      'webhooks:write',
      'account:read',
    ] as const) {
      expect(families, family).toContain(family);
    }
  });
});

describe('secrets stay secret', () => {
  it('no value in logs, audit rows, events or error bodies', async () => {
    const logs = captureLogs();
    const container = s.c as { log: Logger };
    const original = container.log;
    container.log = logs.logger('trace');
    const values: string[] = [];
    const u = await registerUser(s.api);
    try {
      const key = await generate(u, { scopes: ['keys:read'] });
      values.push(key.value);
      const bodies: unknown[] = [];
      bodies.push((await s.api('GET', '/keys/list', { token: key.value })).body);
      bodies.push((await s.api('GET', '/auth/me', { token: key.value })).body);
      bodies.push((await s.api('GET', '/api-keys', { token: key.value })).body);
      const typo = key.value.slice(0, 30) + (key.value[30] === 'Z' ? 'Y' : 'Z') + key.value.slice(31);
      values.push(typo);
      bodies.push((await s.api('GET', '/keys/list', { token: typo })).body);
      await s.api('GET', `/api-keys/${key.key_id}`, { token: u.token });
      const rotated = (await s.api('POST', `/api-keys/${key.key_id}/rotate`, { token: u.token, body: { grace_seconds: 60 } })).body as Generated;
      values.push(rotated.value);
      bodies.push((await s.api('GET', '/keys/list', { token: rotated.value })).body);
      await s.api('DELETE', `/api-keys/${key.key_id}`, { token: u.token });
      bodies.push((await s.api('GET', '/keys/list', { token: rotated.value })).body);
      bodies.push((await s.api('GET', '/keys/list', { token: key.value })).body);
      for (const v of values) expect(JSON.stringify(bodies)).not.toContain(v);
    } finally {
      container.log = original;
    }
    expect(logs.output()).toContain('"msg":"request"');
    // Logged by mistake, a value is still censored (the logger knows the `kms_sk_` shape).
    const mark = logs.output().length;
    const leaky = logs.logger('info');
    leaky.info({ note: `retrying with ${values[0]}`, nested: [{ header: values[2] }] }, `key ${values[0]}`);
    leaky.error({ err: new Error(`refused ${values[2]}`) }, 'failed');
    expect(logs.output().slice(mark)).toContain('[redacted]');
    const audit = JSON.stringify(await s.c.db('audit_logs').where({ user_id: u.id }));
    expect(audit).toContain('api_keys.rotate');
    const events = JSON.stringify((await s.api('GET', '/events/history', { token: u.token })).body);
    expect(events).toContain('api_keys.revoked');
    for (const v of values) {
      for (const secret of [v, v.slice(MANAGED_KEY_PREFIX.length), hashToken(v)]) {
        expect(logs.output(), 'logs').not.toContain(secret);
        expect(audit, 'audit').not.toContain(secret);
        expect(events, 'events').not.toContain(secret);
      }
    }
  });
});
