import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes, randomUUID } from 'node:crypto';
import { SCOPES } from '../../lib/auth/scopes';
import { MANAGED_KEY_PREFIX } from '../../lib/api-key-format';
import { hashToken } from '../../lib/tokens';
import type { Logger } from '../../lib/logger';
import { eventHistory } from '../../lib/event-stream';
import { login, registerUser, startTestService, withClockAhead, type ManualClockFollowingTime, type TestService } from '../support/service';
import { captureLogs } from '../support/logs';

/**
 * Managed API key share links against the real service: a link hands out the key's current value
 * (defaults: 24 hours, one view), parallel views never pass the limit, expiry follows the test clock,
 * revocation of the link or the key ends it, rotation changes what it gives, management needs a
 * session, and neither the value nor the token reaches logs, audit rows or events.
 */
let s: TestService;
beforeAll(async () => {
  // One trusted proxy: each view comes from its own X-Forwarded-For address, so the per-address view
  // limit does not decide these tests (it has its own test in key-shares.test.ts).
  s = await startTestService({ roles: ['web'], env: { TRUSTED_PROXY_COUNT: '1' } });
});
afterAll(async () => {
  await s?.stop();
});

type User = Awaited<ReturnType<typeof registerUser>>;
interface Share {
  share_id: string;
  key_id: string;
  share_token: string;
  url: string;
  state: string;
  expires_at: string;
  max_views: number;
  view_count: number;
  views_remaining: number;
}

const TOKEN = /^kms_as_[A-Za-z0-9_-]{43}$/;
const HOUR = 3_600_000;
const clock = () => s.c.clock as ManualClockFollowingTime;
const randomIp = () => `198.18.${randomBytes(1)[0]}.${randomBytes(1)[0]}`;

async function generate(u: User, body: Record<string, unknown> = {}): Promise<{ key_id: string; value: string; prefix: string }> {
  const res = await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'ci', scopes: ['keys:read'], ...body } });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body;
}

async function share(u: User, keyId: string, body: Record<string, unknown> = {}): Promise<Share> {
  const res = await s.api('POST', `/api-keys/${keyId}/share`, { token: u.token, body });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body;
}

/** A public view: no credentials, from its own client address. */
const view = (token: string) => s.api('GET', `/api-keys/shared/${token}`, { headers: { 'x-forwarded-for': randomIp() } });

const auditOf = (userId: string, action: string) => s.c.db('audit_logs').where({ user_id: userId, action }).orderBy('id');
const shareRow = (id: string) => s.c.db('share_links').where({ id }).first();

describe('POST /api-keys/{key_id}/share and GET /api-keys/shared/{share_token}', () => {
  it('answers the token and URL once; the link gives the value once (by default), and the value authenticates', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u, { name: 'deploy bot', scopes: ['keys:read', 'account:read'] });
    const before = Date.now();
    const created = await share(u, key.key_id);
    expect(created.share_token).toMatch(TOKEN);
    expect(created.url).toBe(`${s.config.publicUrl}/api/v1/api-keys/shared/${created.share_token}`);
    expect(created).toMatchObject({
      key_id: key.key_id,
      key_name: 'deploy bot',
      key_prefix: key.prefix,
      key_status: 'active',
      state: 'active',
      max_views: 1,
      view_count: 0,
      views_remaining: 1,
      revoked_at: null,
    });
    expect(Math.abs(Date.parse(created.expires_at) - (before + 24 * HOUR))).toBeLessThan(10_000);
    expect(JSON.stringify(created)).not.toContain(key.value);
    const row = await shareRow(created.share_id);
    expect(row).toMatchObject({ kind: 'api_key', target_id: key.key_id, token_hash: hashToken(created.share_token), view_limit: 1 });
    expect(JSON.stringify(row)).not.toContain(created.share_token);

    const first = await view(created.share_token);
    expect(first.status).toBe(200);
    expect(first.headers.get('cache-control')).toBe('no-store');
    expect(first.headers.get('x-robots-tag')).toBe('noindex, nofollow');
    expect(first.body).toEqual({
      key_id: key.key_id,
      name: 'deploy bot',
      prefix: key.prefix,
      scopes: ['keys:read', 'account:read'],
      value: key.value,
      expires_at: null,
      share_expires_at: created.expires_at,
      views_remaining: 0,
    });
    // The value handed out is a working credential.
    const me = await s.api('GET', '/keys/list', { token: first.body.value });
    expect(me.status).toBe(200);

    const second = await view(created.share_token);
    expect(second.status).toBe(410);
    expect(second.body.code).toBe('share_exhausted');
    expect(second.headers.get('cache-control')).toBe('no-store');
    expect(JSON.stringify(second.body)).not.toContain(key.value);

    const listed = await s.api('GET', `/api-keys/${key.key_id}/shares`, { token: u.token });
    expect(listed.status).toBe(200);
    expect(listed.body).toMatchObject({ page: 1, page_size: expect.any(Number), total: 1 });
    expect(listed.body.items).toEqual([
      expect.objectContaining({ share_id: created.share_id, state: 'exhausted', view_count: 1, views_remaining: 0, last_viewed_at: expect.any(String) }),
    ]);
    expect(listed.body.items[0]).not.toHaveProperty('token');
    expect(JSON.stringify(listed.body)).not.toContain(created.share_token);

    expect(await auditOf(u.id, 'api_key_shares.create')).toEqual([
      expect.objectContaining({
        status: 'success',
        target: created.share_id,
        details: expect.objectContaining({ key_id: key.key_id, kind: 'api_key', max_views: 1 }),
      }),
    ]);
    const reads = await auditOf(u.id, 'api_key_shares.read_value');
    expect(reads).toEqual([
      expect.objectContaining({ status: 'success', target: key.key_id, details: expect.objectContaining({ share_id: created.share_id, view_count: 1 }) }),
    ]);
    expect(reads[0].ip).toBeTruthy();
  });

  it('takes expires_in_hours, expires_at and max_views; lists shares paginated and by state', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u);
    const at = new Date(Date.now() + 3 * HOUR).toISOString();
    const a = await share(u, key.key_id, { expires_in_hours: 2, max_views: 3 });
    expect(Math.abs(Date.parse(a.expires_at) - (Date.now() + 2 * HOUR))).toBeLessThan(10_000);
    expect(a).toMatchObject({ max_views: 3, views_remaining: 3 });
    const b = await share(u, key.key_id, { expires_at: at });
    expect(b.expires_at).toBe(at);
    expect((await view(a.share_token)).body).toMatchObject({ value: key.value, views_remaining: 2 });
    expect((await view(a.share_token)).body.views_remaining).toBe(1);

    const page1 = await s.api('GET', `/api-keys/${key.key_id}/shares?page_size=1`, { token: u.token });
    expect(page1.body).toMatchObject({ page: 1, page_size: 1, total: 2 });
    expect(page1.body.items.map((i: Share) => i.share_id)).toEqual([b.share_id]);
    const page2 = await s.api('GET', `/api-keys/${key.key_id}/shares?page_size=1&page=2`, { token: u.token });
    expect(page2.body.items).toEqual([expect.objectContaining({ share_id: a.share_id, view_count: 2, views_remaining: 1, max_views: 3 })]);
    expect((await s.api('GET', `/api-keys/${key.key_id}/shares?state=active`, { token: u.token })).body.total).toBe(2);
    expect((await s.api('GET', `/api-keys/${key.key_id}/shares?state=revoked`, { token: u.token })).body.total).toBe(0);
    // Another key of the same account has its own (empty) list.
    const other = await generate(u);
    expect((await s.api('GET', `/api-keys/${other.key_id}/shares`, { token: u.token })).body).toMatchObject({ items: [], total: 0 });
  });

  it('refuses bad input (422), unknown keys (404) and revoked or expired keys (409)', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u);
    const soon = new Date(Date.now() + HOUR).toISOString();
    for (const body of [
      { max_views: 0 },
      { max_views: 101 },
      { max_views: 1.5 },
      { max_views: '1' },
      { expires_in_hours: 0 },
      { expires_in_hours: 30 * 24 + 1 },
      { expires_at: 'tomorrow' },
      { expires_at: new Date(Date.now() - 60_000).toISOString() },
      { expires_at: new Date(Date.now() + 31 * 24 * HOUR).toISOString() },
      { expires_at: soon, expires_in_hours: 2 },
    ]) {
      const res = await s.api('POST', `/api-keys/${key.key_id}/share`, { token: u.token, body });
      expect(res.status, JSON.stringify(body)).toBe(422);
      expect(res.body.code).toBe('validation_failed');
    }
    expect((await s.api('POST', '/api-keys/not-a-uuid/share', { token: u.token, body: {} })).status).toBe(422);
    expect((await s.api('GET', '/api-keys/not-a-uuid/shares', { token: u.token })).status).toBe(422);
    expect((await s.api('GET', `/api-keys/${key.key_id}/shares?state=gone`, { token: u.token })).status).toBe(422);
    const unknown = await s.api('POST', `/api-keys/${randomUUID()}/share`, { token: u.token, body: {} });
    expect(unknown.status).toBe(404);
    expect(unknown.body.code).toBe('api_key_not_found');
    expect((await s.api('POST', `/api-keys/${key.key_id}/share`, { body: {} })).status).toBe(401);

    const expiring = await generate(u, { expires_in_days: 1 });
    await withClockAhead(clock(), 24 * HOUR + 1000, async () => {
      const token = await login(s.api, u);
      const res = await s.api('POST', `/api-keys/${expiring.key_id}/share`, { token, body: {} });
      expect(res.status).toBe(409);
      expect(res.body.code).toBe('api_key_expired');
    });
    expect((await s.api('DELETE', `/api-keys/${key.key_id}`, { token: u.token })).status).toBe(204);
    const revoked = await s.api('POST', `/api-keys/${key.key_id}/share`, { token: u.token, body: {} });
    expect(revoked.status).toBe(409);
    expect(revoked.body.code).toBe('api_key_revoked');
    expect((await auditOf(u.id, 'api_key_shares.create')).map((r) => [r.status, r.details.reason])).toEqual([
      ['failure', 'api_key_expired'],
      ['failure', 'api_key_revoked'],
    ]);
    expect(await s.c.db('share_links').where({ user_id: u.id }).count<{ count: number }[]>({ count: '*' })).toEqual([{ count: 0 }]);
  });

  it('never matches a guessed token: random well-formed ones, near misses and other kinds are 404', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u);
    const real = await share(u, key.key_id, { max_views: 2 });
    const last = real.share_token.at(-1) === 'A' ? 'B' : 'A';
    const guesses = [
      ...Array.from({ length: 10 }, () => `kms_as_${randomBytes(32).toString('base64url')}`),
      real.share_token.slice(0, -1) + last,
      real.share_token.replace('kms_as_', 'kms_ks_'),
      real.share_token.slice(0, -1),
      `${real.share_token}A`,
      key.value,
      'shares',
      'x',
    ];
    for (const guess of guesses) {
      const res = await view(encodeURIComponent(guess));
      expect(res.status, guess).toBe(404);
      expect(res.body.code).toBe('share_not_found');
    }
    expect((await view('x'.repeat(257))).status).toBe(422);
    // Nothing was counted against the real link.
    expect((await shareRow(real.share_id)).view_count).toBe(0);
    expect((await view(real.share_token)).status).toBe(200);
  });
});

describe('view limits, expiry, revocation, rotation', () => {
  it('lets exactly one of 20 parallel views of a one-view share through', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u);
    const once = await share(u, key.key_id);
    const results = await Promise.all(Array.from({ length: 20 }, () => view(once.share_token)));
    expect(results.map((r) => r.status).sort()).toEqual([200, ...Array(19).fill(410)]);
    expect(results.find((r) => r.status === 200)!.body.value).toBe(key.value);
    expect(results.filter((r) => r.status === 410).every((r) => r.body.code === 'share_exhausted')).toBe(true);
    expect((await shareRow(once.share_id)).view_count).toBe(1);
    expect(await s.c.db('share_link_views').where({ share_id: once.share_id }).count<{ count: number }[]>({ count: '*' })).toEqual([{ count: 1 }]);
    expect(await auditOf(u.id, 'api_key_shares.read_value')).toHaveLength(1);
  });

  it('expires by the clock: 410 share_expired once the expiry has passed', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u);
    const hourly = await share(u, key.key_id, { expires_in_hours: 1, max_views: 5 });
    const daily = await share(u, key.key_id, { max_views: 5 });
    expect((await view(hourly.share_token)).status).toBe(200);
    await withClockAhead(clock(), HOUR + 1000, async () => {
      const expired = await view(hourly.share_token);
      expect(expired.status).toBe(410);
      expect(expired.body.code).toBe('share_expired');
      expect((await view(daily.share_token)).status).toBe(200);
      const token = await login(s.api, u);
      expect((await s.api('GET', `/api-keys/${key.key_id}/shares?state=expired`, { token })).body.items.map((i: Share) => i.share_id)).toEqual([
        hourly.share_id,
      ]);
    });
    expect((await view(hourly.share_token)).status).toBe(200);
    await withClockAhead(clock(), 24 * HOUR + 1000, async () => {
      expect((await view(daily.share_token)).body.code).toBe('share_expired');
    });
  });

  it('revokes with DELETE (204 twice, one audit row and event); a revoked link is 410; another account’s id is 404', async () => {
    const u = await registerUser(s.api);
    const other = await registerUser(s.api);
    const key = await generate(u);
    const link = await share(u, key.key_id, { max_views: 5 });
    expect((await view(link.share_token)).status).toBe(200);

    const stranger = await s.api('DELETE', `/api-keys/shares/${link.share_id}`, { token: other.token });
    expect(stranger.status).toBe(404);
    expect(stranger.body.code).toBe('share_not_found');
    expect(await auditOf(other.id, 'api_key_shares.deny_access')).toEqual([
      expect.objectContaining({ status: 'failure', target: link.share_id, details: { reason: 'not_owner' } }),
    ]);
    expect((await view(link.share_token)).status).toBe(200);
    const missing = await s.api('DELETE', `/api-keys/shares/${randomUUID()}`, { token: u.token });
    expect(missing.status).toBe(404);
    expect([missing.body.code, missing.body.detail]).toEqual([stranger.body.code, stranger.body.detail]);
    expect((await s.api('DELETE', '/api-keys/shares/not-a-uuid', { token: u.token })).status).toBe(422);
    expect((await s.api('DELETE', `/api-keys/shares/${link.share_id}`)).status).toBe(401);

    expect((await s.api('DELETE', `/api-keys/shares/${link.share_id}`, { token: u.token })).status).toBe(204);
    expect((await s.api('DELETE', `/api-keys/shares/${link.share_id}`, { token: u.token })).status).toBe(204);
    const gone = await view(link.share_token);
    expect(gone.status).toBe(410);
    expect(gone.body.code).toBe('share_revoked');
    expect(await auditOf(u.id, 'api_key_shares.revoke')).toEqual([
      expect.objectContaining({
        status: 'success',
        target: link.share_id,
        details: expect.objectContaining({ kind: 'api_key', target_id: key.key_id, view_count: 2 }),
      }),
    ]);
    const events = await eventHistory(s.c.redis, s.config.redisPrefix, u.id, { types: ['share_links.created', 'share_links.revoked', 'share_links.viewed'] });
    expect(events.map((e) => e.type).sort()).toEqual(['share_links.created', 'share_links.revoked', 'share_links.viewed']);
    const listed = await s.api('GET', `/api-keys/${key.key_id}/shares?state=revoked`, { token: u.token });
    expect(listed.body.items).toEqual([expect.objectContaining({ share_id: link.share_id, state: 'revoked', view_count: 2, revoked_at: expect.any(String) })]);
    expect(await auditOf(u.id, 'api_key_shares.read_value')).toHaveLength(2);
  });

  it('answers 410 api_key_revoked once the key is revoked, and counts no view', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u);
    const link = await share(u, key.key_id, { max_views: 3 });
    expect((await view(link.share_token)).status).toBe(200);
    expect((await s.api('DELETE', `/api-keys/${key.key_id}`, { token: u.token })).status).toBe(204);
    const refused = await view(link.share_token);
    expect(refused.status).toBe(410);
    expect(refused.body.code).toBe('api_key_revoked');
    expect(JSON.stringify(refused.body)).not.toContain(key.value);
    expect((await shareRow(link.share_id)).view_count).toBe(1);
    const listed = await s.api('GET', `/api-keys/${key.key_id}/shares`, { token: u.token });
    expect(listed.body.items[0]).toMatchObject({ share_id: link.share_id, key_status: 'revoked', view_count: 1, views_remaining: 2 });
  });

  it('answers 410 api_key_expired once the key has expired', async () => {
    const u = await registerUser(s.api);
    const key = (await generate(u, { expires_in_days: 1 })) as Awaited<ReturnType<typeof generate>> & { expires_at: string };
    const link = await share(u, key.key_id, { expires_in_hours: 48, max_views: 3 });
    expect((await view(link.share_token)).body).toMatchObject({ value: key.value, expires_at: key.expires_at });
    await withClockAhead(clock(), 24 * HOUR + 1000, async () => {
      const refused = await view(link.share_token);
      expect(refused.status).toBe(410);
      expect(refused.body.code).toBe('api_key_expired');
    });
    expect((await shareRow(link.share_id)).view_count).toBe(1);
  });

  it('gives the current value after a rotation, never the replaced one', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u);
    const link = await share(u, key.key_id, { max_views: 3 });
    const rotated = await s.api('POST', `/api-keys/${key.key_id}/rotate`, { token: u.token, body: { grace_seconds: 3600 } });
    expect(rotated.status).toBe(200);
    const next = rotated.body.value as string;
    expect(next).not.toBe(key.value);
    const res = await view(link.share_token);
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ key_id: key.key_id, value: next, prefix: next.slice(0, 13) });
    expect(JSON.stringify(res.body)).not.toContain(key.value);
    expect((await s.api('GET', '/keys/list', { token: res.body.value })).status).toBe(200);
    // A second rotation: the same link follows again.
    const third = (await s.api('POST', `/api-keys/${key.key_id}/rotate`, { token: u.token, body: {} })).body.value as string;
    expect((await view(link.share_token)).body.value).toBe(third);
  });
});

describe('ownership and credentials', () => {
  it("answers 404 for another account's key id on create and list, and audits the attempt", async () => {
    const ann = await registerUser(s.api);
    const eve = await registerUser(s.api);
    const key = await generate(ann);
    await share(ann, key.key_id);
    const create = await s.api('POST', `/api-keys/${key.key_id}/share`, { token: eve.token, body: {} });
    expect(create.status).toBe(404);
    expect(create.body.code).toBe('api_key_not_found');
    const list = await s.api('GET', `/api-keys/${key.key_id}/shares`, { token: eve.token });
    expect(list.status).toBe(404);
    expect(list.body.code).toBe('api_key_not_found');
    expect(JSON.stringify([create.body, list.body])).not.toContain(key.value);
    expect(await auditOf(eve.id, 'api_keys.deny_access')).toHaveLength(2);
    expect(await s.c.db('share_links').where({ user_id: eve.id }).count<{ count: number }[]>({ count: '*' })).toEqual([{ count: 0 }]);
    expect((await s.api('GET', `/api-keys/${key.key_id}/shares`, { token: ann.token })).body.total).toBe(1);
  });

  it('refuses API keys, managed and partner, on the management routes (403 session_required)', async () => {
    const u = await registerUser(s.api);
    const key = await generate(u);
    const link = await share(u, key.key_id);
    const everything = await generate(u, { name: 'all', scopes: [...SCOPES] });
    for (const credential of [everything.value, u.apiKey]) {
      for (const [method, path, body] of [
        ['POST', `/api-keys/${key.key_id}/share`, {}],
        ['GET', `/api-keys/${key.key_id}/shares`, undefined],
        ['DELETE', `/api-keys/shares/${link.share_id}`, undefined],
      ] as const) {
        const res = await s.api(method, path, { token: credential, body });
        expect([res.status, res.body.code], `${method} ${path}`).toEqual([403, 'session_required']);
      }
    }
    expect((await shareRow(link.share_id)).revoked_at).toBeNull();
    expect(await s.c.db('share_links').where({ user_id: u.id }).count<{ count: number }[]>({ count: '*' })).toEqual([{ count: 1 }]);
  });
});

describe('secrets stay secret', () => {
  it('no value or token in logs, audit rows or events; the access log names the route template', async () => {
    const logs = captureLogs();
    const container = s.c as { log: Logger };
    const original = container.log;
    container.log = logs.logger('trace');
    const u = await registerUser(s.api);
    const secrets: string[] = [];
    try {
      const key = await generate(u);
      secrets.push(key.value);
      const link = await share(u, key.key_id, { max_views: 2 });
      secrets.push(link.share_token);
      expect((await view(link.share_token)).status).toBe(200);
      const rotated = (await s.api('POST', `/api-keys/${key.key_id}/rotate`, { token: u.token, body: {} })).body.value as string;
      secrets.push(rotated);
      expect((await view(link.share_token)).body.value).toBe(rotated);
      expect((await view(link.share_token)).status).toBe(410);
      await s.api('DELETE', `/api-keys/shares/${link.share_id}`, { token: u.token });
      expect((await view(link.share_token)).status).toBe(410);
      const guess = `kms_as_${randomBytes(32).toString('base64url')}`;
      secrets.push(guess);
      expect((await view(guess)).status).toBe(404);
    } finally {
      container.log = original;
    }
    expect(logs.output()).toContain('"route":"/api/v1/api-keys/shared/:share_token"');
    expect(logs.output()).toContain('"route":"/api/v1/api-keys/:key_id/share"');
    const audit = JSON.stringify(await s.c.db('audit_logs').where({ user_id: u.id }));
    expect(audit).toContain('api_key_shares.read_value');
    const events = JSON.stringify(await eventHistory(s.c.redis, s.config.redisPrefix, u.id, {}));
    expect(events).toContain('share_links.viewed');
    for (const v of secrets) {
      const forms = [v, hashToken(v), v.startsWith(MANAGED_KEY_PREFIX) ? v.slice(MANAGED_KEY_PREFIX.length) : v.slice('kms_as_'.length)];
      for (const secret of forms) {
        expect(logs.output(), 'logs').not.toContain(secret);
        expect(audit, 'audit').not.toContain(secret);
        expect(events, 'events').not.toContain(secret);
      }
    }
  });
});
