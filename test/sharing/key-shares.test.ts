import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { registerUser, startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { startSmtpServer } from '../support/smtp';
import { PASSPHRASE, createKey, download, runJob } from '../support/keys';
import { createPgpHome, type PgpHome } from '../support/gpg';
import { teamHelpers } from '../support/teams';
import { eventHistory } from '../../lib/event-stream';
import { VIEW_RETENTION_DAYS } from '../../lib/sharing/share-links';
import { userAgentClass } from '../../lib/user-agent';

/**
 * Public key shares against the real service: tokens, expiry by the test clock, view limits under
 * parallel requests, revocation, the recipient's notice through a real SMTP server, the shared key in
 * gpg and sq across a rotation, the per-address limit and the analytics.
 */
let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;
let home: PgpHome;
const VIEWS_PER_MINUTE = 30;

beforeAll(async () => {
  smtp = await startSmtpServer();
  // One trusted proxy: each test's views come from their own X-Forwarded-For address, so the per-address
  // limit is exercised on its own and does not leak between tests.
  s = await startTestService({ env: { SMTP_URL: smtp.url, TRUSTED_PROXY_COUNT: '1', SHARE_VIEWS_PER_MINUTE: String(VIEWS_PER_MINUTE) } });
  home = await createPgpHome();
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
  await home?.cleanup();
});

const clock = () => s.c.clock as ManualClockFollowingTime;
const randomIp = () => `198.18.${randomBytes(1)[0]}.${randomBytes(1)[0]}`;
const TOKEN = /^kms_ks_[A-Za-z0-9_-]{43}$/;

/** A public view: no credentials, its own client address unless one is given. */
function view(token: string, opts: { ip?: string; accept?: string; ua?: string } = {}) {
  const headers: Record<string, string> = { 'x-forwarded-for': opts.ip ?? randomIp() };
  if (opts.accept) headers.accept = opts.accept;
  if (opts.ua) headers['user-agent'] = opts.ua;
  return s.api('GET', `/keys/share/${token}`, { headers });
}

async function share(token: string, body: Record<string, unknown>) {
  const res = await s.api('POST', '/keys/share/create', { token, body });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as { share_id: string; share_token: string; url: string; fingerprint: string; lineage_id: string; state: string; view_count: number };
}

async function audit(token: string, action: string) {
  const res = await s.api('GET', `/audit-logs?action=${encodeURIComponent(action)}&page_size=100`, { token });
  expect(res.status).toBe(200);
  return res.body.items as { action: string; status: string; target: string; details: Record<string, unknown> }[];
}

describe('POST /keys/share/create and GET /keys/share/{share_token}', () => {
  it('answers the token and link once, stores only the hash, and serves the key as JSON or application/pgp-keys', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token, { label: 'partner key' });
    const created = await share(u.token, { fingerprint: key.fingerprint, max_views: 5, expires_in_hours: 24 });
    expect(created.share_token).toMatch(TOKEN);
    expect(created.url).toBe(`${s.config.publicUrl}/api/v1/keys/share/${created.share_token}`);
    expect(created).toMatchObject({
      lineage_id: key.lineage_id,
      fingerprint: key.fingerprint,
      state: 'active',
      view_count: 0,
      max_views: 5,
      views_remaining: 5,
      recipient_email: null,
      notice_queued: false,
    });

    const row = await s.c.db('share_links').where({ id: created.share_id }).first();
    expect(row.token_hash).toBe(createHash('sha256').update(created.share_token).digest('hex'));
    expect(JSON.stringify(row)).not.toContain(created.share_token);

    const json = await view(created.share_token);
    expect(json.status).toBe(200);
    expect(json.headers.get('content-type')).toContain('application/json');
    expect(json.headers.get('cache-control')).toBe('no-store');
    expect(json.body).toMatchObject({
      fingerprint: key.fingerprint,
      label: 'partner key',
      status: 'active',
      generation: 1,
      views_remaining: 4,
      expires_at: null,
    });
    expect(json.body.public_key).toMatch(/^-----BEGIN PGP PUBLIC KEY BLOCK-----/);
    expect(json.body.public_key).not.toContain('PRIVATE');

    const armored = await view(created.share_token, { accept: 'application/pgp-keys' });
    expect(armored.status).toBe(200);
    expect(armored.headers.get('content-type')).toContain('application/pgp-keys');
    expect(armored.body).toBe(json.body.public_key);
    // A browser's Accept (text/html first, no pgp-keys in it) gets the page (test/sharing/share-pages.test.ts); */* alone gets JSON.
    expect((await view(created.share_token, { accept: 'text/html,application/xhtml+xml,*/*;q=0.8' })).headers.get('content-type')).toContain('text/html');
    expect((await view(created.share_token, { accept: '*/*' })).headers.get('content-type')).toContain('application/json');

    expect((await s.c.db('share_links').where({ id: created.share_id }).first()).view_count).toBe(4);
    const rows = await audit(u.token, 'key_shares.create');
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({
      status: 'success',
      target: created.share_id,
      details: { fingerprint: key.fingerprint, lineage_id: key.lineage_id, max_views: 5, recipient: false },
    });
    expect(JSON.stringify(rows)).not.toContain(created.share_token);
  });

  it('refuses bad input, unknown and foreign keys, disabled keys and missing credentials', async () => {
    const u = await registerUser(s.api);
    const other = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const foreign = await createKey(s.api, other.token);
    const create = (body: unknown) => s.api('POST', '/keys/share/create', { token: u.token, body });

    expect((await s.api('POST', '/keys/share/create', { body: { fingerprint: key.fingerprint } })).status).toBe(401);
    for (const body of [
      {},
      { fingerprint: 'not a fingerprint' },
      { fingerprint: key.fingerprint, max_views: 0 },
      { fingerprint: key.fingerprint, max_views: 1.5 },
      { fingerprint: key.fingerprint, expires_in_hours: 0 },
      { fingerprint: key.fingerprint, expires_at: 'tomorrow' },
      { fingerprint: key.fingerprint, expires_at: new Date(Date.now() + 3600_000).toISOString(), expires_in_hours: 2 },
      { fingerprint: key.fingerprint, expires_at: new Date(Date.now() - 60_000).toISOString() },
      { fingerprint: key.fingerprint, recipient_email: 'not-an-address' },
    ]) {
      const res = await create(body);
      expect(res.status, JSON.stringify(body)).toBe(422);
      expect(res.body.code).toBe('validation_failed');
    }
    const unknown = await create({ fingerprint: 'ab'.repeat(20) });
    expect(unknown.status).toBe(404);
    expect(unknown.body.code).toBe('key_not_found');
    const theirs = await create({ fingerprint: foreign.fingerprint });
    expect(theirs.status).toBe(404);
    expect(theirs.body).toEqual({ ...unknown.body, request_id: theirs.body.request_id });
    // Whether another account holds a fingerprint is not the caller's to learn, from its audit trail either.
    expect(await audit(u.token, 'keys.deny_access')).toEqual([]);

    expect((await s.api('POST', '/keys/disable-key', { token: u.token, body: { fingerprint: key.fingerprint } })).status).toBe(200);
    const disabled = await create({ fingerprint: key.fingerprint });
    expect(disabled.status).toBe(409);
    expect(disabled.body.code).toBe('key_disabled');
    expect(await audit(u.token, 'key_shares.create')).toEqual([expect.objectContaining({ status: 'failure', details: { reason: 'key_disabled' } })]);
    expect(await s.c.db('share_links').where({ user_id: u.id }).count<{ count: number }[]>({ count: '*' })).toEqual([{ count: 0 }]);
  });

  it('never matches a guessed token: random well-formed tokens and malformed ones are 404', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const real = await share(u.token, { fingerprint: key.fingerprint });
    const ip = randomIp();
    const guesses = Array.from({ length: 20 }, () => `kms_ks_${randomBytes(32).toString('base64url')}`);
    // Near misses of the real token too: one character changed, wrong prefix, truncated, padded.
    const last = real.share_token.at(-1) === 'A' ? 'B' : 'A';
    guesses.push(
      real.share_token.slice(0, -1) + last,
      real.share_token.replace('kms_ks_', 'kms_as_'),
      real.share_token.slice(0, -1),
      `${real.share_token}A`,
      'x',
      '%00',
    );
    for (const [i, guess] of guesses.entries()) {
      const res = await view(guess === '%00' ? guess : encodeURIComponent(guess), { ip: i < VIEWS_PER_MINUTE - 1 ? ip : randomIp() });
      expect(res.status, guess).toBe(guess === '%00' ? 422 : 404);
      expect(res.body.code).toBe(guess === '%00' ? 'validation_failed' : 'share_not_found');
    }
    expect((await view(real.share_token)).status).toBe(200);
  });
});

describe('view limits, expiry, revocation and disabled keys', () => {
  it('lets exactly one of 20 parallel views of a one-view share through', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const once = await share(u.token, { fingerprint: key.fingerprint, max_views: 1 });
    const results = await Promise.all(Array.from({ length: 20 }, () => view(once.share_token)));
    const statuses = results.map((r) => r.status).sort();
    expect(statuses).toEqual([200, ...Array(19).fill(410)]);
    expect(results.filter((r) => r.status === 410).every((r) => r.body.code === 'share_exhausted')).toBe(true);
    expect((await s.c.db('share_links').where({ id: once.share_id }).first()).view_count).toBe(1);
    expect(await s.c.db('share_link_views').where({ share_id: once.share_id }).count<{ count: number }[]>({ count: '*' })).toEqual([{ count: 1 }]);
    const listed = await s.api('GET', '/keys/share/?state=exhausted', { token: u.token });
    expect(listed.body.items.map((i: { share_id: string }) => i.share_id)).toEqual([once.share_id]);
  });

  it('expires by the clock: 410 share_expired once the expiry has passed', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const hourly = await share(u.token, { fingerprint: key.fingerprint, expires_in_hours: 1 });
    expect(Math.abs(Date.parse((hourly as unknown as { expires_at: string }).expires_at) - (Date.now() + 3600_000))).toBeLessThan(10_000);
    const soon = await share(u.token, { fingerprint: key.fingerprint, expires_at: new Date(Date.now() + 5 * 60_000).toISOString() });
    expect((await view(soon.share_token)).status).toBe(200);
    // Ten minutes on: the session (an hour) still works, the five-minute link does not.
    clock().advance(10 * 60_000);
    try {
      const expired = await view(soon.share_token);
      expect(expired.status).toBe(410);
      expect(expired.body.code).toBe('share_expired');
      expect((await view(hourly.share_token)).status).toBe(200);
      const list = await s.api('GET', '/keys/share/?state=expired', { token: u.token });
      expect(list.body.items.map((i: { share_id: string }) => i.share_id)).toEqual([soon.share_id]);
      expect((await s.api('GET', '/keys/share/?state=active', { token: u.token })).body.items.map((i: { share_id: string }) => i.share_id)).toEqual([
        hourly.share_id,
      ]);
    } finally {
      clock().advance(-10 * 60_000);
    }
    expect((await view(soon.share_token)).status).toBe(200);
  });

  it('revokes with DELETE (204 twice, one audit row and event); a revoked link is 410; another account’s id is 404', async () => {
    const u = await registerUser(s.api);
    const other = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const link = await share(u.token, { fingerprint: key.fingerprint });
    expect((await view(link.share_token)).status).toBe(200);

    const stranger = await s.api('DELETE', `/keys/share/${link.share_id}`, { token: other.token });
    expect(stranger.status).toBe(404);
    expect(stranger.body.code).toBe('share_not_found');
    expect(await audit(other.token, 'key_shares.deny_access')).toEqual([
      expect.objectContaining({ status: 'failure', target: link.share_id, details: { reason: 'not_owner' } }),
    ]);
    expect((await view(link.share_token)).status).toBe(200);
    const missing = await s.api('DELETE', `/keys/share/${randomUUID()}`, { token: u.token });
    expect(missing.status).toBe(404);
    expect(missing.body.code).toBe('share_not_found');
    expect((await s.api('DELETE', '/keys/share/not-a-uuid', { token: u.token })).status).toBe(422);
    expect((await s.api('DELETE', `/keys/share/${link.share_id}`)).status).toBe(401);

    expect((await s.api('DELETE', `/keys/share/${link.share_id}`, { token: u.token })).status).toBe(204);
    expect((await s.api('DELETE', `/keys/share/${link.share_id}`, { token: u.token })).status).toBe(204);
    const gone = await view(link.share_token);
    expect(gone.status).toBe(410);
    expect(gone.body.code).toBe('share_revoked');
    expect(await audit(u.token, 'key_shares.revoke')).toEqual([
      expect.objectContaining({
        status: 'success',
        target: link.share_id,
        details: expect.objectContaining({ kind: 'public_key', target_id: key.lineage_id, view_count: 2 }),
      }),
    ]);
    const events = await eventHistory(s.c.redis, s.config.redisPrefix, u.id, { types: ['share_links.created', 'share_links.revoked'] });
    expect(events.map((e) => e.type).sort()).toEqual(['share_links.created', 'share_links.revoked']);
    expect(JSON.stringify(events)).not.toContain(link.share_token);
    const listed = await s.api('GET', '/keys/share/?state=revoked', { token: u.token });
    expect(listed.body.items).toEqual([expect.objectContaining({ share_id: link.share_id, state: 'revoked', view_count: 2, revoked_at: expect.any(String) })]);
  });

  it('answers 410 key_disabled for a disabled key’s shares and does not count the view', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const link = await share(u.token, { fingerprint: key.fingerprint, max_views: 3 });
    expect((await view(link.share_token)).status).toBe(200);
    expect((await s.api('POST', '/keys/disable-key', { token: u.token, body: { fingerprint: key.fingerprint } })).status).toBe(200);
    const refused = await view(link.share_token);
    expect(refused.status).toBe(410);
    expect(refused.body.code).toBe('key_disabled');
    expect((await s.c.db('share_links').where({ id: link.share_id }).first()).view_count).toBe(1);
    const listed = await s.api('GET', '/keys/share/', { token: u.token });
    expect(listed.body.items[0]).toMatchObject({ share_id: link.share_id, key_status: 'disabled', view_count: 1, views_remaining: 2 });
  });

  it('stops serving when the owner’s account is deleted', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const link = await share(u.token, { fingerprint: key.fingerprint });
    expect((await s.api('POST', '/profile/delete-account', { token: u.token, body: { password: u.password } })).status).toBe(200);
    const res = await view(link.share_token);
    expect(res.status).toBe(410);
    expect(res.body.code).toBe('share_revoked');
  });

  it('refuses a public key whose row was changed in the database (500), and counts no view', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const other = await createKey(s.api, u.token, { label: 'other', email: 'other@example.test' });
    const link = await share(u.token, { fingerprint: key.fingerprint });
    const original = await s.c.db('pgp_keys').where({ fingerprint: key.fingerprint }).first();
    const swapped = await s.c.db('pgp_keys').where({ fingerprint: other.fingerprint }).first();
    await s.c.db('pgp_keys').where({ id: original.id }).update({ public_armored: swapped.public_armored });
    try {
      const res = await view(link.share_token);
      expect(res.status).toBe(500);
      expect(JSON.stringify(res.body)).not.toContain('BEGIN PGP');
      expect((await s.c.db('share_links').where({ id: link.share_id }).first()).view_count).toBe(0);
    } finally {
      await s.c.db('pgp_keys').where({ id: original.id }).update({ public_armored: original.public_armored });
    }
    expect((await view(link.share_token)).status).toBe(200);
  });
});

describe('GET /keys/share/', () => {
  it('pages the caller’s shares with view counts and their links, filters by key and state', async () => {
    const u = await registerUser(s.api);
    const other = await registerUser(s.api);
    const a = await createKey(s.api, u.token, { label: 'a' });
    const b = await createKey(s.api, u.token, { label: 'b', email: 'b@example.test' });
    const foreign = await createKey(s.api, other.token);
    const made = [];
    for (let i = 0; i < 3; i++) made.push(await share(u.token, { fingerprint: a.fingerprint }));
    made.push(await share(u.token, { fingerprint: b.fingerprint, max_views: 2 }));
    await share(other.token, { fingerprint: foreign.fingerprint });
    await view(made[0].share_token);
    await view(made[0].share_token);

    const page1 = await s.api('GET', '/keys/share/?page_size=2', { token: u.token });
    expect(page1.status).toBe(200);
    expect(page1.body).toMatchObject({ page: 1, page_size: 2, total: 4 });
    expect(page1.body.items.map((i: { share_id: string }) => i.share_id)).toEqual([made[3].share_id, made[2].share_id]);
    const page2 = await s.api('GET', '/keys/share/?page_size=2&page=2', { token: u.token });
    expect(page2.body.items.map((i: { share_id: string }) => i.share_id)).toEqual([made[1].share_id, made[0].share_id]);
    expect(page2.body.items[1]).toMatchObject({
      view_count: 2,
      fingerprint: a.fingerprint,
      label: 'a',
      lineage_id: a.lineage_id,
      last_viewed_at: expect.any(String),
    });
    // Active shares give their link back (the token is kept sealed), so a person who has it can be sent it again.
    for (const item of [...page1.body.items, ...page2.body.items]) {
      const m = made.find((x) => x.share_id === item.share_id)!;
      expect([item.share_token, item.url]).toEqual([m.share_token, m.url]);
    }

    const byKey = await s.api('GET', `/keys/share/?fingerprint=${b.fingerprint.toUpperCase()}`, { token: u.token });
    expect(byKey.body.items.map((i: { share_id: string }) => i.share_id)).toEqual([made[3].share_id]);
    expect(byKey.body.items[0]).toMatchObject({ max_views: 2, views_remaining: 2, state: 'active' });
    // The path is SPEC.md's, trailing slash included; without it the same list answers (never the token route).
    const unslashed = await s.api('GET', `/keys/share?fingerprint=${b.fingerprint}`, { token: u.token });
    expect([unslashed.status, unslashed.body.items.map((i: { share_id: string }) => i.share_id)]).toEqual([200, [made[3].share_id]]);
    expect((await s.api('GET', `/keys/share/?fingerprint=${foreign.fingerprint}`, { token: u.token })).status).toBe(404);
    expect((await s.api('GET', '/keys/share/?state=sleeping', { token: u.token })).status).toBe(422);
    expect((await s.api('GET', '/keys/share/?page_size=500', { token: u.token })).status).toBe(422);
    expect((await s.api('GET', '/keys/share/')).status).toBe(401);
  });
});

describe('API key scopes', () => {
  it('lets a managed key with shares:read list and read analytics, and only one with shares:write create and revoke', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const managed = async (scopes: string[]) => {
      const res = await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: scopes.join(' '), scopes } });
      expect(res.status, JSON.stringify(res.body)).toBe(201);
      return res.body.value as string;
    };
    const reader = await managed(['shares:read']);
    const writer = await managed(['shares:write']);
    const refused = await s.api('POST', '/keys/share/create', { token: reader, body: { fingerprint: key.fingerprint } });
    expect(refused.status).toBe(403);
    expect(refused.body.code).toBe('insufficient_scope');
    const created = await share(writer, { fingerprint: key.fingerprint });
    expect((await s.api('GET', '/keys/share/', { token: reader })).body.items.map((i: { share_id: string }) => i.share_id)).toEqual([created.share_id]);
    expect((await s.api('GET', '/keys/share/analytics', { token: reader })).status).toBe(200);
    expect((await s.api('GET', '/keys/share/', { token: writer })).status).toBe(403);
    expect((await s.api('DELETE', `/keys/share/${created.share_id}`, { token: reader })).status).toBe(403);
    expect((await s.api('DELETE', `/keys/share/${created.share_id}`, { token: writer })).status).toBe(204);
  });
});

describe('recipient notice by email', () => {
  it('mails the link and the fingerprint through the notify queue; the link works; the address is stored sealed', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token, { label: 'mail key' });
    const to = `recipient_${randomBytes(4).toString('hex')}@example.test`;
    const created = await share(u.token, { fingerprint: key.fingerprint, recipient_email: to, max_views: 2 });
    expect(created).toMatchObject({ recipient_email: to, notice_queued: true });

    const mail = await smtp.waitFor(to);
    expect(mail.subject).toContain(u.username);
    expect(mail.text).toContain(key.fingerprint.toUpperCase());
    const link = /Link: (\S+)/.exec(mail.text ?? '')?.[1];
    expect(link).toBe(created.url);
    // The configured public URL is the base of the link; the service under test listens on its own port.
    const path = new URL(link!).pathname.replace(/^\/api\/v1/, '');
    const res = await s.api('GET', path, { headers: { accept: 'application/pgp-keys', 'x-forwarded-for': randomIp() } });
    expect(res.status).toBe(200);
    expect(res.body).toMatch(/^-----BEGIN PGP PUBLIC KEY BLOCK-----/);

    const row = await s.c.db('share_links').where({ id: created.share_id }).first();
    expect(JSON.stringify(row)).not.toContain(to);
    expect((await s.api('GET', '/keys/share/', { token: u.token })).body.items[0].recipient_email).toBe(to);
    expect(JSON.stringify(await audit(u.token, 'key_share.*'))).not.toContain(to);
  });
});

describe('the shared key in gpg and sq, across a rotation', () => {
  it('imports into gpg and sq, and after a rotation serves the new generation, which gpg encrypts to', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token, { label: 'interop', email: 'interop@example.test' });
    const link = await share(u.token, { fingerprint: key.fingerprint });

    const first = await view(link.share_token, { accept: 'application/pgp-keys', ua: 'curl/8.5.0' });
    const certPath = await home.put('shared-1.asc', first.body as string);
    await home.gpg(['--import', certPath]);
    expect((await home.gpg(['--with-colons', '--list-keys', key.fingerprint])).stdout.toString().toLowerCase()).toContain(key.fingerprint);
    expect((await home.sq(['inspect', certPath])).stdout.toString().toLowerCase().replace(/\s/g, '')).toContain(key.fingerprint);

    const rotated = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
    expect(rotated.status, JSON.stringify(rotated.body)).toBe(200);
    expect(rotated.body.state).toBe('completed');
    const current = (await s.api('GET', '/keys/list', { token: u.token })).body.items.find((k: { lineage_id: string }) => k.lineage_id === key.lineage_id);
    expect(current.fingerprint).not.toBe(key.fingerprint);

    const after = await view(link.share_token);
    expect(after.body).toMatchObject({ fingerprint: current.fingerprint, generation: 2 });
    const certPath2 = await home.put('shared-2.asc', after.body.public_key as string);
    await home.gpg(['--import', certPath2]);
    expect((await home.sq(['inspect', certPath2])).stdout.toString().toLowerCase().replace(/\s/g, '')).toContain(current.fingerprint);
    const plain = randomBytes(4096);
    const plainPath = await home.put('to-shared.bin', plain);
    const out = home.file('to-shared.gpg');
    await home.gpg(['--encrypt', '-r', current.fingerprint, '-o', out, plainPath]);
    const job = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: current.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'to-shared.gpg', data: await readFile(out) }],
    });
    expect(job.state, JSON.stringify(job.error)).toBe('completed');
    expect(Buffer.compare(await download(s.api, u.token, job.job_id), plain)).toBe(0);
  }, 120_000);
});

describe('rate limit per address', () => {
  it('answers 429 with Retry-After once an address has spent its views, before any lookup; other addresses go on', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const link = await share(u.token, { fingerprint: key.fingerprint });
    const ip = randomIp();
    for (let i = 0; i < VIEWS_PER_MINUTE - 1; i++) expect((await view(`kms_ks_${randomBytes(32).toString('base64url')}`, { ip })).status).toBe(404);
    expect((await view(link.share_token, { ip })).status).toBe(200);
    const limited = await view(link.share_token, { ip });
    expect(limited.status).toBe(429);
    expect(limited.body.code).toBe('rate_limited');
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThan(0);
    expect(Number(limited.headers.get('retry-after'))).toBeLessThanOrEqual(60);
    // Refused before the lookup: the share's count did not move.
    expect((await s.c.db('share_links').where({ id: link.share_id }).first()).view_count).toBe(1);
    expect((await view(link.share_token, { ip: randomIp() })).status).toBe(200);
  });
});

describe('GET /keys/share/analytics and share_links.viewed events', () => {
  it('counts shares by state, views per day, the most viewed keys and the recent views, as made', async () => {
    const u = await registerUser(s.api);
    const a = await createKey(s.api, u.token, { label: 'popular' });
    const b = await createKey(s.api, u.token, { label: 'quiet', email: 'quiet@example.test' });
    const busy = await share(u.token, { fingerprint: a.fingerprint });
    const once = await share(u.token, { fingerprint: b.fingerprint, max_views: 1 });
    const revoked = await share(u.token, { fingerprint: b.fingerprint });
    await share(u.token, { fingerprint: a.fingerprint, expires_at: new Date(Date.now() + 5 * 60_000).toISOString() });
    const agents = [
      'curl/8.5.0',
      'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36',
      'python-requests/2.31',
      'Googlebot/2.1 (+http://www.google.com/bot.html)',
    ];
    for (let i = 0; i < 11; i++) expect((await view(busy.share_token, { ua: agents[i % agents.length] })).status).toBe(200);
    expect((await view(once.share_token, { ua: 'GnuPG/2.2.40' })).status).toBe(200);
    expect((await view(once.share_token)).status).toBe(410); // refused views are not counted
    expect((await view(revoked.share_token)).status).toBe(200);
    expect((await s.api('DELETE', `/keys/share/${revoked.share_id}`, { token: u.token })).status).toBe(204);
    clock().advance(10 * 60_000);
    try {
      const res = await s.api('GET', '/keys/share/analytics', { token: u.token });
      expect(res.status).toBe(200);
      const body = res.body;
      expect(body.totals).toEqual({ active: 1, expired: 1, revoked: 1, exhausted: 1, shares: 4, views: 13 });
      expect(body.views_by_day).toHaveLength(30);
      // The views happened today (real time); the clock moved ten minutes on, which may be tomorrow in UTC.
      const today = new Date().toISOString().slice(0, 10);
      expect(body.views_by_day.filter((d: { views: number }) => d.views > 0)).toEqual([{ day: today, views: 13 }]);
      expect(body.views_by_day.at(-1).day).toBe(new Date(Date.now() + 10 * 60_000).toISOString().slice(0, 10));
      expect(body.top_keys).toEqual([
        { lineage_id: a.lineage_id, fingerprint: a.fingerprint, label: 'popular', views: 11, shares: 2 },
        { lineage_id: b.lineage_id, fingerprint: b.fingerprint, label: 'quiet', views: 2, shares: 2 },
      ]);
      expect(body.recent_views).toHaveLength(13);
      expect(body.recent_views[0]).toMatchObject({ share_id: revoked.share_id, lineage_id: b.lineage_id });
      expect(body.recent_views[1]).toMatchObject({ share_id: once.share_id, ua_class: 'cli' });
      const classes = body.recent_views.filter((v: { share_id: string }) => v.share_id === busy.share_id).map((v: { ua_class: string }) => v.ua_class);
      expect(classes.sort()).toEqual(['bot', 'bot', 'browser', 'browser', 'browser', 'cli', 'cli', 'cli', 'library', 'library', 'library']);
      expect(JSON.stringify(body)).not.toMatch(/198\.18\.|Mozilla|curl/);
    } finally {
      clock().advance(-10 * 60_000);
    }
    expect((await s.api('GET', '/keys/share/analytics')).status).toBe(401);
    // Another account's numbers are its own.
    const other = await registerUser(s.api);
    expect((await s.api('GET', '/keys/share/analytics', { token: other.token })).body.totals).toEqual({
      active: 0,
      expired: 0,
      revoked: 0,
      exhausted: 0,
      shares: 0,
      views: 0,
    });

    // share_links.viewed is sampled: the 1st and 10th views of the busy share, the 1st of the others.
    const viewed = await eventHistory(s.c.redis, s.config.redisPrefix, u.id, { types: ['share_links.viewed'] });
    const counts = viewed.filter((e) => e.data.share_id === busy.share_id).map((e) => e.data.view_count);
    expect(counts.sort()).toEqual([1, 10]);
    expect(viewed).toHaveLength(4);
  });
});

describe('view records', () => {
  it('are purged after VIEW_RETENTION_DAYS by the maintenance sweep; the share keeps its count', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const link = await share(u.token, { fingerprint: key.fingerprint });
    expect((await view(link.share_token)).status).toBe(200);
    const viewsOf = () => s.c.db('share_link_views').where({ share_id: link.share_id });
    const sweep = async () => {
      const id = await s.c.jobs.enqueue('purge-expired', {});
      await expect.poll(async () => (await s.c.jobs.queue('maintenance').getJob(id))?.finishedOn !== undefined, { timeout: 10_000 }).toBe(true);
    };
    await sweep();
    expect(await viewsOf()).toHaveLength(1);
    clock().advance((VIEW_RETENTION_DAYS + 1) * 86_400_000);
    try {
      await sweep();
      expect(await viewsOf()).toHaveLength(0);
      expect(await s.c.db('share_links').where({ id: link.share_id }).first()).toMatchObject({ view_count: 1 });
    } finally {
      clock().advance(-(VIEW_RETENTION_DAYS + 1) * 86_400_000);
    }
  });
});

describe('logs and the user agent classes', () => {
  it('logs the route template of a view, never the token', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const link = await share(u.token, { fingerprint: key.fingerprint });
    const lines: unknown[] = [];
    type Writer = (...args: unknown[]) => void;
    const log = s.c.log as unknown as { child: (bindings: object) => Record<'info' | 'warn' | 'error', Writer> };
    const originalChild = log.child;
    // Every request logs through a child of the container's logger: record what each one is given.
    log.child = function (this: unknown, bindings: object) {
      const child = originalChild.call(this, bindings);
      for (const level of ['info', 'warn', 'error'] as const) {
        const write = child[level].bind(child);
        child[level] = (...args: unknown[]) => {
          lines.push(args);
          write(...args);
        };
      }
      return child;
    };
    try {
      expect((await view(link.share_token)).status).toBe(200);
      expect((await view(`kms_ks_${'A'.repeat(43)}`)).status).toBe(404);
    } finally {
      log.child = originalChild;
    }
    const text = JSON.stringify(lines);
    expect(text).toContain('/api/v1/keys/share/:share_token');
    expect(text).not.toContain(link.share_token);
    expect(text).not.toContain('A'.repeat(43));
  });

  it('names the route template, not the token, in the audit row of a refused credential sent to a share link', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const link = await share(u.token, { fingerprint: key.fingerprint });
    const stale = u.token;
    expect((await s.api('POST', '/auth/logout', { token: stale })).status).toBe(200);
    expect((await s.api('GET', `/keys/share/${link.share_token}`, { token: stale })).status).toBe(401);
    const rows = await s.c.db('audit_logs').where({ user_id: u.id, action: 'sessions.deny' });
    expect(rows.map((r: { target: string }) => r.target)).toEqual(['/api/v1/keys/share/:share_token']);
    expect(JSON.stringify(rows)).not.toContain(link.share_token);
  });

  it('classifies user agents coarsely', () => {
    expect(userAgentClass('curl/8.5.0')).toBe('cli');
    expect(userAgentClass('Wget/1.21')).toBe('cli');
    expect(userAgentClass('GnuPG/2.2.40')).toBe('cli');
    expect(userAgentClass('python-requests/2.31')).toBe('library');
    expect(userAgentClass('node')).toBe('library');
    expect(userAgentClass('Go-http-client/1.1')).toBe('library');
    expect(userAgentClass('Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15')).toBe(
      'browser',
    );
    expect(userAgentClass('Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)')).toBe('bot');
    expect(userAgentClass('Slackbot-LinkExpanding 1.0')).toBe('bot');
    expect(userAgentClass('')).toBe('other');
    expect(userAgentClass(undefined)).toBe('other');
    expect(userAgentClass('SomethingElse/1.0')).toBe('other');
  });
});

describe('shares of a key made through team access', () => {
  const { team, link } = teamHelpers(() => ({ s, smtp }));
  const list = async (token: string, query = '') =>
    (await s.api('GET', `/keys/share/${query}`, { token })).body.items as {
      share_id: string;
      state: string;
      created_by: { user_id: string; username: string };
    }[];

  it("are listed to the key's owner, marked with who made them, and the owner revokes them; a teammate sees and revokes only its own", async () => {
    const [owner, member] = await team(2);
    const key = await createKey(s.api, owner.token);
    await link(member, owner);
    const theirs = await share(member.token, { fingerprint: key.fingerprint });
    const hers = await share(owner.token, { fingerprint: key.fingerprint });

    const seen = await list(owner.token);
    expect(seen.map((x) => [x.share_id, x.created_by.user_id]).sort()).toEqual(
      [
        [theirs.share_id, member.id],
        [hers.share_id, owner.id],
      ].sort(),
    );
    expect(seen.find((x) => x.share_id === theirs.share_id)!.created_by.username).toBe(member.username);
    expect((await list(owner.token, `?fingerprint=${key.fingerprint}`)).map((x) => x.share_id).sort()).toEqual([theirs.share_id, hers.share_id].sort());
    expect((await list(member.token)).map((x) => x.share_id)).toEqual([theirs.share_id]);

    expect((await s.api('DELETE', `/keys/share/${hers.share_id}`, { token: member.token })).status).toBe(404);
    expect((await view(hers.share_token)).status).toBe(200);
    expect((await s.api('DELETE', `/keys/share/${theirs.share_id}`, { token: owner.token })).status).toBe(204);
    expect([(await view(theirs.share_token)).status, (await view(theirs.share_token)).body.code]).toEqual([410, 'share_revoked']);
    expect((await list(member.token))[0]).toMatchObject({ share_id: theirs.share_id, state: 'revoked' });
    // Both hear of it: the maker through its event and audit row, the owner through hers.
    expect((await eventHistory(s.c.redis, s.c.config.redisPrefix, member.id, { types: ['share_links.revoked'] })).map((e) => e.data.share_id)).toEqual([
      theirs.share_id,
    ]);
    expect(await s.c.db('audit_logs').where({ action: 'key_shares.revoke', target: theirs.share_id }).pluck('user_id')).toEqual(
      expect.arrayContaining([owner.id, member.id]),
    );
  });
});
