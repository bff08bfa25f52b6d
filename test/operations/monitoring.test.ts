import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createKey, encrypt } from '../support/keys';
import { startProcess, waitForOutput } from '../support/process';
import { startProxy } from '../support/proxy';

/** Prometheus metrics (API and worker ports), worker health and readiness, and the queue dashboard. */
const METRICS_TOKEN = 'metrics-token-for-tests-0123456789';
let s: TestService;
beforeAll(async () => {
  s = await startTestService({ env: { METRICS_TOKEN, QUEUE_DASHBOARD: 'read-only' } });
});
afterAll(async () => {
  await s?.stop();
});

const origin = () => s.url.replace(/\/api\/v1$/, '');

async function admin() {
  const u = await registerUser(s.api);
  await s.c.db('users').where({ id: u.id }).update({ role: 'admin' }); // as `npm run admin -- grant` does
  return u;
}

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/**
 * A strict reader of the Prometheus text exposition format (0.0.4): every line is a HELP or TYPE
 * comment or a sample `name{label="value",...} number`; anything else fails the test.
 */
function parsePrometheus(text: string): Sample[] {
  const samples: Sample[] = [];
  const typed = new Set<string>();
  for (const line of text.split('\n')) {
    if (!line) continue;
    const comment = /^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$/.exec(line);
    if (comment) {
      if (comment[1] === 'TYPE') {
        expect(['counter', 'gauge', 'histogram', 'summary', 'untyped']).toContain(comment[3]);
        typed.add(comment[2]);
      }
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (-?(?:\d+(?:\.\d+)?(?:e[+-]?\d+)?|NaN|\+Inf|-Inf))$/.exec(line);
    if (!m) throw new Error(`not Prometheus text: ${line}`);
    const labels: Record<string, string> = {};
    for (const [, k, v] of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v!;
    const family = m[1].replace(/_(bucket|sum|count)$/, '');
    expect(typed.has(m[1]) || typed.has(family), `${m[1]} has a TYPE line`).toBe(true);
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

const valueOf = (samples: Sample[], name: string, labels: Record<string, string>) =>
  samples.filter((x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v)).reduce((n, x) => n + x.value, 0);

async function scrape(url = `${origin()}/metrics`): Promise<Sample[]> {
  const res = await fetch(url, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return parsePrometheus(await res.text());
}

describe('GET /metrics', () => {
  it('needs METRICS_TOKEN: 401 without or with a wrong token; 404 when no token is configured', async () => {
    expect((await fetch(`${origin()}/metrics`)).status).toBe(401);
    expect((await fetch(`${origin()}/metrics`, { headers: { authorization: 'Bearer wrong-token-wrong-token' } })).status).toBe(401);
    const u = await registerUser(s.api);
    expect((await fetch(`${origin()}/metrics`, { headers: { authorization: `Bearer ${u.token}` } })).status).toBe(401);
    const bare = await startTestService({ roles: ['web'] });
    try {
      const res = await fetch(`${bare.url.replace(/\/api\/v1$/, '')}/metrics`);
      expect(res.status).toBe(404);
      expect(res.headers.get('content-type')).toContain('application/problem+json');
    } finally {
      await bare.stop();
    }
  });

  it('parses as Prometheus text, and its counters move when work is done', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const before = await scrape();
    const data = randomBytes(12_345);
    await encrypt(s.api, u.token, key.fingerprint, [{ name: 'a.bin', data }]);
    await s.api('GET', '/keys/list', { token: u.token });
    // The worker counts a job once its attempt has returned, a moment after the row says completed.
    const jobsCounted = (samples: Sample[]) => valueOf(samples, 'kms_jobs_total', { queue: 'crypto', job: 'encrypt-files', outcome: 'completed' });
    let after = await scrape();
    for (let tries = 0; jobsCounted(after) === jobsCounted(before) && tries < 50; tries++) {
      await new Promise((r) => setTimeout(r, 20));
      after = await scrape();
    }

    const delta = (name: string, labels: Record<string, string>) => valueOf(after, name, labels) - valueOf(before, name, labels);
    expect(delta('kms_crypto_bytes_total', { operation: 'encrypt' })).toBe(data.length);
    expect(delta('kms_jobs_total', { queue: 'crypto', job: 'encrypt-files', outcome: 'completed' })).toBe(1);
    expect(delta('kms_job_duration_seconds_count', { queue: 'crypto', job: 'encrypt-files', outcome: 'completed' })).toBe(1);
    // Requests by route template (never the raw path) and status, with a latency histogram.
    expect(delta('kms_http_requests_total', { method: 'GET', route: '/api/v1/keys/list', status: '200' })).toBe(1);
    expect(delta('kms_http_request_duration_seconds_count', { method: 'GET', route: '/api/v1/keys/list', status: '200' })).toBe(1);
    expect(after.some((x) => x.name === 'kms_http_requests_total' && x.labels.route?.includes(key.fingerprint))).toBe(false);
    // Queue depths for every queue and state, and the process's own metrics.
    for (const queue of ['crypto', 'rotation', 'notify', 'billing', 'team-sync', 'maintenance']) {
      expect(
        after
          .filter((x) => x.name === 'kms_queue_jobs' && x.labels.queue === queue)
          .map((x) => x.labels.state)
          .sort(),
      ).toEqual(['active', 'completed', 'delayed', 'failed', 'waiting']);
    }
    expect(after.some((x) => x.name === 'process_resident_memory_bytes')).toBe(true);
  });
});

describe('worker processes', () => {
  it('serve /healthz, /readyz (503 while Postgres is unreachable) and their own /metrics on WORKER_HTTP_PORT', async () => {
    const pgProxy = await startProxy('127.0.0.1', 5432);
    const dbUrl = new URL(s.env.DATABASE_URL);
    dbUrl.host = `127.0.0.1:${pgProxy.port}`;
    const worker = startProcess('worker', { ...s.env, LOG_LEVEL: 'info', WORKER_QUEUES: 'crypto=1', WORKER_HTTP_PORT: '0', DATABASE_URL: dbUrl.toString() });
    try {
      await waitForOutput(worker, 'worker health server listening');
      const port = Number(/"port":(\d+),[^\n]*worker health server listening/.exec(worker.output())![1]);
      const base = `http://127.0.0.1:${port}`;
      expect((await fetch(`${base}/healthz`)).status).toBe(200);
      const ready = await fetch(`${base}/readyz`);
      expect(ready.status).toBe(200);
      expect(await ready.json()).toEqual({ status: 'ready', checks: { postgres: 'up', redis: 'up', keyring: 'current' } });
      expect((await fetch(`${base}/metrics`)).status).toBe(401);
      const samples = await scrape(`${base}/metrics`);
      expect(samples.some((x) => x.name === 'kms_queue_jobs')).toBe(true);
      expect((await fetch(`${base}/nope`)).status).toBe(404);

      pgProxy.cut();
      const down = await fetch(`${base}/readyz`);
      expect(down.status).toBe(503);
      expect(await down.json()).toMatchObject({ status: 'not_ready', checks: { postgres: 'down', redis: 'up' } });
      // Liveness does not depend on the database: the process itself is fine.
      expect((await fetch(`${base}/healthz`)).status).toBe(200);
      pgProxy.restore();
      await expect.poll(async () => (await fetch(`${base}/readyz`)).status, { timeout: 10_000 }).toBe(200);
    } finally {
      worker.kill('SIGKILL');
      await worker.exited;
      await pgProxy.close();
    }
  }, 60_000);
});

describe('queue dashboard', () => {
  const dashboard = (path = '', init: RequestInit = {}) => fetch(`${origin()}/admin/queues${path}`, { redirect: 'manual', ...init });

  it('is for administrators only: 401 without credentials, 403 for others (audited), and never for API keys', async () => {
    expect((await dashboard()).status).toBe(401);
    expect((await dashboard('/api/queues')).status).toBe(401);
    const u = await registerUser(s.api);
    const res = await dashboard('', { headers: { authorization: `Bearer ${u.token}` } });
    expect(res.status).toBe(403);
    expect(await s.c.db('audit_logs').where({ user_id: u.id, action: 'sessions.deny' })).toHaveLength(1);
    const a = await admin();
    expect((await dashboard('/api/queues', { headers: { authorization: `Bearer ${a.apiKey}` } })).status).toBe(403);
    expect((await dashboard('/session', { method: 'POST', headers: { authorization: `Bearer ${u.token}` } })).status).toBe(403);
  });

  it('shows the queues to an admin, read-only, its page asking nothing of another host', async () => {
    const a = await admin();
    const auth = { authorization: `Bearer ${a.token}` };
    const page = await dashboard('', { headers: auth });
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toContain('text/html');
    expect(page.headers.get('x-frame-options')).toBe('DENY');
    expect(page.headers.get('content-security-policy')).toMatch(/default-src 'self'/);
    expect(await page.text()).not.toMatch(/https?:\/\/(?!localhost|127\.0\.0\.1)[\w.-]+\.\w+/);
    const queues = await dashboard('/api/queues', { headers: auth });
    expect(queues.status).toBe(200);
    const body = (await queues.json()) as { queues: { name: string; readOnlyMode: boolean }[] };
    expect(body.queues.map((q) => q.name).sort()).toEqual(['billing', 'crypto', 'maintenance', 'notify', 'rotation', 'team-sync']);
    expect(body.queues.every((q) => q.readOnlyMode)).toBe(true);
    // Actions are refused in read-only mode.
    const retry = await dashboard('/api/queues/crypto/retry/failed', { method: 'PUT', headers: auth });
    expect(retry.status).toBeGreaterThanOrEqual(400);
    expect(retry.status).toBeLessThan(500);
  });

  it('opens in a browser through an HttpOnly, SameSite=Strict session cookie that ends with the session', async () => {
    const a = await admin();
    const opened = await dashboard('/session', { method: 'POST', headers: { authorization: `Bearer ${a.token}` } });
    expect(opened.status).toBe(204);
    const setCookie = opened.headers.get('set-cookie')!;
    expect(setCookie).toMatch(/^kms_dashboard=[^;]+; path=\/admin\/queues; expires=[^;]+; samesite=strict; httponly$/);
    const cookie = setCookie.split(';')[0];
    expect((await dashboard('/api/queues', { headers: { cookie } })).status).toBe(200);
    // Logging out everywhere ends the dashboard session too: the token is checked on every request.
    expect((await s.api('POST', '/auth/logout', { token: a.token })).status).toBe(200);
    expect((await dashboard('/api/queues', { headers: { cookie } })).status).toBe(401);
    const closed = await dashboard('/session', { method: 'DELETE' });
    expect(closed.status).toBe(204);
    expect(closed.headers.get('set-cookie')).toMatch(/^kms_dashboard=;/);
  });

  it("opens directly with the console's session cookie: for administrators only, a change only from the service's own page", async () => {
    const consoleCookie = async (token: string) => {
      const set = await fetch(`${origin()}/api/v1/auth/session`, { method: 'POST', headers: { authorization: `Bearer ${token}` } });
      expect(set.status).toBe(200);
      return set.headers.get('set-cookie')!.split(';')[0];
    };
    const a = await admin();
    const cookie = await consoleCookie(a.token);
    expect(cookie).toMatch(/^kms_session=/);
    const page = await dashboard('', { headers: { cookie } });
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toContain('text/html');
    expect((await dashboard('/api/queues', { headers: { cookie } })).status).toBe(200);
    // A change the browser makes for another site with the console's cookie is refused before the dashboard.
    const forged = await dashboard('/api/queues/crypto/retry/failed', { method: 'PUT', headers: { cookie, origin: 'https://evil.example' } });
    expect(forged.status).toBe(403);
    expect(await forged.json()).toMatchObject({ code: 'cross_origin_request' });
    const u = await registerUser(s.api);
    expect((await dashboard('', { headers: { cookie: await consoleCookie(u.token) } })).status).toBe(403);
  });
});

describe('queue dashboard, read-write, opened by its cookie', () => {
  let rw: TestService;
  beforeAll(async () => {
    // No worker: a job the dashboard adds stays waiting where the test can count it.
    rw = await startTestService({ roles: ['web'], env: { QUEUE_DASHBOARD: 'read-write' } });
  });
  afterAll(async () => {
    await rw?.stop();
  });

  it("refuses a change another site makes with the cookie (Origin or Sec-Fetch-Site, as the console's cookie), does nothing, and accepts its own page's", async () => {
    const own = rw.url.replace(/\/api\/v1$/, '');
    const u = await registerUser(rw.api);
    await rw.c.db('users').where({ id: u.id }).update({ role: 'admin' });
    const opened = await fetch(`${own}/admin/queues/session`, { method: 'POST', headers: { authorization: `Bearer ${u.token}` } });
    expect(opened.status).toBe(204);
    const cookie = opened.headers.get('set-cookie')!.split(';')[0];
    const board = (path: string, method: string, headers: Record<string, string>, body?: unknown) =>
      fetch(`${own}/admin/queues/api/queues${path}`, {
        method,
        headers: { cookie, ...(body ? { 'content-type': 'application/json' } : {}), ...headers },
        body: body ? JSON.stringify(body) : undefined,
      });
    const notify = rw.c.jobs.queue('notify');
    const add = { name: 'forged', data: {}, options: {} };
    // A form another site posts (urlencoded: no preflight) carries the cookie and the other site's Origin.
    const forged = await fetch(`${own}/admin/queues/api/queues/notify/add`, {
      method: 'POST',
      headers: { cookie, origin: 'https://evil.example', 'content-type': 'application/x-www-form-urlencoded' },
      body: 'name=forged',
    });
    expect([forged.status, forged.headers.get('content-type')]).toEqual([403, expect.stringContaining('application/problem+json')]);
    expect(await forged.json()).toMatchObject({ status: 403, code: 'cross_origin_request' });
    const crossSite = await board('/notify/pause', 'PUT', { 'sec-fetch-site': 'cross-site' });
    expect([crossSite.status, ((await crossSite.json()) as { code: string }).code]).toEqual([403, 'cross_site_request']);
    const sameSite = await board('/notify/add', 'POST', { 'sec-fetch-site': 'same-site', origin: own }, add);
    expect([sameSite.status, ((await sameSite.json()) as { code: string }).code]).toEqual([403, 'cross_site_request']);
    // A browser always says where a change comes from; a request that says nothing is not the dashboard's page.
    const silent = await board('/notify/add', 'POST', {}, add);
    expect([silent.status, ((await silent.json()) as { code: string }).code]).toEqual([403, 'origin_required']);
    // Only jobs named as the forged ones were would be its doing (registration queued its confirmation mail).
    const forgedJobs = async () => (await notify.getJobs(['waiting', 'delayed'])).filter((j) => j.name === 'forged').length;
    expect(await forgedJobs()).toBe(0);
    expect(await notify.isPaused()).toBe(false);

    // The dashboard's own page: its requests carry the service's Origin (and Sec-Fetch-Site: same-origin).
    const added = await board('/notify/add', 'POST', { origin: own, 'sec-fetch-site': 'same-origin' }, add);
    expect(added.status, await added.clone().text()).toBe(200);
    expect(await forgedJobs()).toBe(1);
    expect((await board('/notify/pause', 'PUT', { 'sec-fetch-site': 'same-origin' })).status).toBe(200);
    expect(await notify.isPaused()).toBe(true);
    // Reads need no proof; a Bearer header is unchanged (the cookie is not looked at).
    expect((await board('', 'GET', {})).status).toBe(200);
    expect((await fetch(`${own}/admin/queues/api/queues/notify/resume`, { method: 'PUT', headers: { authorization: `Bearer ${u.token}` } })).status).toBe(200);
    expect(await notify.isPaused()).toBe(false);

    // The console's session cookie alone (the dashboard opened directly): the same rules, no console header needed.
    const set = await fetch(`${rw.url}/auth/session`, { method: 'POST', headers: { authorization: `Bearer ${u.token}` } });
    const session = set.headers.get('set-cookie')!.split(';')[0];
    const byConsole = (headers: Record<string, string>) =>
      fetch(`${own}/admin/queues/api/queues/notify/pause`, { method: 'PUT', headers: { cookie: session, ...headers } });
    expect(((await (await byConsole({ origin: 'https://evil.example' })).json()) as { code: string }).code).toBe('cross_origin_request');
    expect(((await (await byConsole({})).json()) as { code: string }).code).toBe('origin_required');
    expect(await notify.isPaused()).toBe(false);
    expect((await byConsole({ origin: own, 'sec-fetch-site': 'same-origin' })).status).toBe(200);
    expect(await notify.isPaused()).toBe(true);
  });
});
