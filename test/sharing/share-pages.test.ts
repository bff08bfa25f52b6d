import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash, randomBytes } from 'node:crypto';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createKey } from '../support/keys';

/**
 * What a share link answers a browser (`Accept: text/html`), against the real service: the public key's
 * page (escaped, fingerprint in groups, the `.asc` download and the gpg line), the API-key share's page
 * that spends no view until its Reveal form is posted, error pages with the refusal's status, the strict
 * Content-Security-Policy; and the share lists giving an active share's link back.
 */
let s: TestService;
beforeAll(async () => {
  // One trusted proxy: each view comes from its own X-Forwarded-For address (the per-address limit has its own test).
  s = await startTestService({ env: { TRUSTED_PROXY_COUNT: '1' } });
});
afterAll(async () => {
  await s?.stop();
});

const BROWSER = 'text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8';
const HOSTILE = `<script>alert("x")</script> & 'q'`;
const randomIp = () => `198.18.${randomBytes(1)[0]}.${randomBytes(1)[0]}`;
const open = (method: string, path: string, accept = BROWSER) => s.api(method, path, { headers: { accept, 'x-forwarded-for': randomIp() } });
const shareRow = (id: string) => s.c.db('share_links').where({ id }).first();

/** The page's policy: nothing but its own inline stylesheet, by hash; no script, no requests, forms only where it has one. */
function expectStrictPage(res: { status: number; headers: Headers; body: string }, forms: 'self' | 'none') {
  expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
  expect(res.headers.get('cache-control')).toBe('no-store');
  expect(res.headers.get('x-robots-tag')).toBe('noindex, nofollow');
  expect(res.headers.get('referrer-policy')).toBe('no-referrer');
  const csp = res.headers.get('content-security-policy') ?? '';
  const style = /<style>([\s\S]*?)<\/style>/.exec(res.body)![1];
  expect(csp).toContain("default-src 'none'");
  expect(csp).toContain(`style-src 'sha256-${createHash('sha256').update(style).digest('base64')}'`);
  expect(csp).toContain(`form-action '${forms}'`);
  expect(csp).toContain("frame-ancestors 'none'");
  expect(csp).not.toContain('unsafe');
  expect(res.body).not.toMatch(/<script|\son\w+=|src=|https?:\/\/(?!localhost|127\.0\.0\.1)/i);
}

describe('GET /keys/share/{share_token} in a browser', () => {
  it('answers a page: whose key, the fingerprint in groups of 4, expiry, the .asc download and the gpg line, every value escaped', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token, { label: HOSTILE });
    const created = (await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint, expires_in_hours: 5 } })).body;
    const page = await open('GET', `/keys/share/${created.share_token}`);
    expect(page.status).toBe(200);
    expectStrictPage(page, 'none');
    expect(page.body).not.toContain(HOSTILE);
    expect(page.body).toContain('&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;q&#39;');
    expect(page.body).toContain('Ann Example &lt;ann@example.test&gt;');
    expect(page.body).toContain(key.fingerprint.toUpperCase().match(/.{4}/g)!.join(' '));
    expect(page.body).toContain(`curl -s '${created.url}?format=asc' | gpg --import`);
    expect(page.body).toContain('href="?format=asc"');
    expect(page.body).toContain(`<time datetime="${created.expires_at}">`);

    const asc = await open('GET', `/keys/share/${created.share_token}?format=asc`);
    expect(asc.status).toBe(200);
    expect(asc.headers.get('content-type')).toContain('application/pgp-keys');
    expect(asc.headers.get('content-disposition')).toBe(`attachment; filename="${key.fingerprint}.asc"`);
    expect(asc.body).toMatch(/^-----BEGIN PGP PUBLIC KEY BLOCK-----/);
    // JSON stays the answer of a client that does not ask for a page.
    const json = await open('GET', `/keys/share/${created.share_token}`, 'application/json');
    expect(json.body.public_key).toBe(asc.body);
    expect((await open('GET', `/keys/share/${created.share_token}?format=pdf`)).status).toBe(422);
    expect((await shareRow(created.share_id)).view_count).toBe(3);
  });

  it('answers an error page with the refusal’s status: unknown 404, revoked and used up 410', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const once = (await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint, max_views: 1 } })).body;
    const revoked = (await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint } })).body;
    expect((await s.api('DELETE', `/keys/share/${revoked.share_id}`, { token: u.token })).status).toBe(204);
    expect((await open('GET', `/keys/share/${once.share_token}`)).status).toBe(200);

    for (const [token, status, code] of [
      [once.share_token, 410, 'share_exhausted'],
      [revoked.share_token, 410, 'share_revoked'],
      [`kms_ks_${'A'.repeat(43)}`, 404, 'share_not_found'],
      ['<b>', 404, 'share_not_found'],
    ] as const) {
      const res = await open('GET', `/keys/share/${encodeURIComponent(token)}`);
      expect([res.status, res.headers.get('content-type')], token).toEqual([status, 'text/html; charset=utf-8']);
      expectStrictPage(res, 'none');
      expect(res.body).toContain(`(${code})`);
      expect(res.body).not.toContain('<b>');
    }
  });
});

describe('GET and POST /api-keys/shared/{share_token} in a browser', () => {
  it('spends no view on GET (a prefetch), spends it on the Reveal form, shows the value once, then an error page', async () => {
    const u = await registerUser(s.api);
    const key = (await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: HOSTILE, scopes: ['keys:read'] } })).body;
    const link = (await s.api('POST', `/api-keys/${key.key_id}/share`, { token: u.token, body: {} })).body;

    for (let i = 0; i < 3; i++) {
      const page = await open('GET', `/api-keys/shared/${link.share_token}`);
      expect(page.status).toBe(200);
      expectStrictPage(page, 'self');
      expect(page.body).toContain('<form method="post"><button type="submit">Reveal the key</button></form>');
      expect(page.body).toContain(key.prefix);
      expect(page.body).not.toContain(key.value);
      expect(page.body).not.toContain(HOSTILE);
      expect(page.body).toContain('&lt;script&gt;');
    }
    expect(await shareRow(link.share_id)).toMatchObject({ view_count: 0, last_viewed_at: null });
    expect(await s.c.db('share_link_views').where({ share_id: link.share_id })).toEqual([]);
    expect(await s.c.db('audit_logs').where({ user_id: u.id, action: 'api_key_shares.read_value' })).toEqual([]);

    // What the browser sends for the form: an empty urlencoded body, Accept text/html.
    const revealed = await s.api('POST', `/api-keys/shared/${link.share_token}`, {
      headers: { accept: BROWSER, 'content-type': 'application/x-www-form-urlencoded', 'x-forwarded-for': randomIp() },
      raw: '',
    });
    expect(revealed.status).toBe(200);
    expectStrictPage(revealed, 'none');
    expect(revealed.body).toContain(`<pre>${key.value}</pre>`);
    expect((await shareRow(link.share_id)).view_count).toBe(1);

    for (const method of ['GET', 'POST']) {
      const after = await open(method, `/api-keys/shared/${link.share_token}`);
      expect([after.status, after.headers.get('content-type')]).toEqual([410, 'text/html; charset=utf-8']);
      expectStrictPage(after, 'none');
      expect(after.body).toContain('(share_exhausted)');
      expect(after.body).not.toContain(key.value);
    }
    expect((await open('GET', `/api-keys/shared/kms_as_${'A'.repeat(43)}`)).status).toBe(404);
  });

  it('answers JSON clients as before: POST spends a view like GET does', async () => {
    const u = await registerUser(s.api);
    const key = (await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'bot', scopes: ['keys:read'] } })).body;
    const link = (await s.api('POST', `/api-keys/${key.key_id}/share`, { token: u.token, body: { max_views: 2 } })).body;
    const first = await open('POST', `/api-keys/shared/${link.share_token}`, 'application/json');
    expect([first.status, first.body.value, first.body.views_remaining]).toEqual([200, key.value, 1]);
    const second = await open('GET', `/api-keys/shared/${link.share_token}`, 'application/json');
    expect([second.status, second.body.value, second.body.views_remaining]).toEqual([200, key.value, 0]);
    const third = await open('POST', `/api-keys/shared/${link.share_token}`, 'application/json');
    expect([third.status, third.body.code]).toEqual([410, 'share_exhausted']);
  });

  it('shows a revoked key’s share as an error page without a view', async () => {
    const u = await registerUser(s.api);
    const key = (await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'bot', scopes: ['keys:read'] } })).body;
    const link = (await s.api('POST', `/api-keys/${key.key_id}/share`, { token: u.token, body: {} })).body;
    expect((await s.api('DELETE', `/api-keys/${key.key_id}`, { token: u.token })).status).toBeLessThan(300);
    const page = await open('GET', `/api-keys/shared/${link.share_token}`);
    expect([page.status, page.body.includes('(api_key_revoked)')]).toEqual([410, true]);
    expect((await shareRow(link.share_id)).view_count).toBe(0);
  });
});

describe('share lists give an active share’s link back', () => {
  it('answers share_token and url while active (sealed in the database), null once revoked and for rows made before', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const a = (await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint } })).body;
    const b = (await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint } })).body;
    const old = (await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint } })).body;
    expect((await s.api('DELETE', `/keys/share/${b.share_id}`, { token: u.token })).status).toBe(204);
    // A row from before the sealed token was kept.
    await s.c.db('share_links').where({ id: old.share_id }).update({ token_sealed: null });
    const row = await shareRow(a.share_id);
    expect(row.token_sealed).toMatch(/^s1\./);
    expect(JSON.stringify(row)).not.toContain(a.share_token);

    const items = (await s.api('GET', '/keys/share/', { token: u.token })).body.items as { share_id: string; share_token: string | null; url: string | null }[];
    const byId = new Map(items.map((i) => [i.share_id, [i.share_token, i.url]]));
    expect(byId.get(a.share_id)).toEqual([a.share_token, a.url]);
    expect(byId.get(b.share_id)).toEqual([null, null]);
    expect(byId.get(old.share_id)).toEqual([null, null]);
    // The link listed opens.
    expect((await open('GET', `/keys/share/${byId.get(a.share_id)![0]}`, 'application/json')).status).toBe(200);

    const apiKey = (await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'bot', scopes: ['keys:read'] } })).body;
    const link = (await s.api('POST', `/api-keys/${apiKey.key_id}/share`, { token: u.token, body: { max_views: 1 } })).body;
    const listed = async () => (await s.api('GET', `/api-keys/${apiKey.key_id}/shares`, { token: u.token })).body.items[0];
    expect(await listed()).toMatchObject({ share_id: link.share_id, share_token: link.share_token, url: link.url });
    expect((await open('GET', `/api-keys/shared/${link.share_token}`, 'application/json')).status).toBe(200);
    expect(await listed()).toMatchObject({ state: 'exhausted', share_token: null, url: null });
  });
});
