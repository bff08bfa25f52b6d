import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Webhook } from 'standardwebhooks';
import { registerUser, startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { createKey } from '../support/keys';
import { signedHeaders, startReceiver } from '../support/webhook-receiver';
import { isPublicAddress } from '../../lib/webhooks/address';
import { postWebhook } from '../../lib/webhooks/send';
import { fanOut } from '../../lib/webhooks/endpoints';
import { createContainer } from '../../lib/container';

/** Outbound webhooks: signed per Standard Webhooks (verified with the spec authors' package), retried, recorded. */
let s: TestService;
type Receiver = Awaited<ReturnType<typeof startReceiver>>;
const receivers: Receiver[] = [];

beforeAll(async () => {
  s = await startTestService({ env: { WEBHOOK_RETRY_SCHEDULE: '200ms,400ms,600ms', WEBHOOK_TIMEOUT_SECONDS: '1' } });
});
afterAll(async () => {
  await Promise.all(receivers.map((r) => r.close()));
  await s?.stop();
});

async function receiver(answers?: (number | 'hang')[], headers?: Record<string, string>) {
  const r = await startReceiver({ answers, headers });
  receivers.push(r);
  return r;
}

/** Tests that send pings subscribe to a type nothing here emits: `webhook.test` reaches every endpoint. */
const PINGS_ONLY = { event_types: ['keys.expired'] };

async function subscribe(token: string, url: string, body: Record<string, unknown> = {}) {
  const res = await s.api('POST', '/webhooks', { token, body: { url, ...body } });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as { webhook_id: string; secret: string; event_types: string[] };
}

const deliveriesOf = async (token: string, id: string, query = '') => (await s.api('GET', `/webhooks/${id}/deliveries${query}`, { token })).body.items as any[];

describe('webhook endpoints', () => {
  it('creates, lists without the secret, updates and deletes; other accounts see 404', async () => {
    const u = await registerUser(s.api);
    const eve = await registerUser(s.api);
    const hook = await subscribe(u.token, 'http://127.0.0.1:9/a', { event_types: ['keys.generated', 'keys.generated'], description: 'ops' });
    expect(hook.secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    expect(hook.event_types).toEqual(['keys.generated']);

    const list = await s.api('GET', '/webhooks', { token: u.token });
    expect(list.body).toMatchObject({ items: [{ webhook_id: hook.webhook_id }], page: 1, page_size: 20, total: 1 });
    expect(JSON.stringify(list.body)).not.toContain('whsec_');
    expect((await s.api('GET', `/webhooks/${hook.webhook_id}`, { token: u.token })).body.description).toBe('ops');

    const patched = await s.api('PATCH', `/webhooks/${hook.webhook_id}`, { token: u.token, body: { enabled: false, event_types: [] } });
    expect(patched.body).toMatchObject({ enabled: false, event_types: [] });
    expect((await s.api('PATCH', `/webhooks/${hook.webhook_id}`, { token: u.token, body: {} })).status).toBe(422);
    expect((await s.api('PATCH', `/webhooks/${hook.webhook_id}`, { token: u.token, body: { event_types: ['no.such'] } })).status).toBe(422);

    for (const [method, path] of [
      ['GET', ''],
      ['PATCH', ''],
      ['DELETE', ''],
      ['POST', '/rotate-secret'],
      ['POST', '/test'],
      ['GET', '/deliveries'],
    ] as const) {
      const res = await s.api(method, `/webhooks/${hook.webhook_id}${path}`, {
        token: eve.token,
        body: method === 'PATCH' ? { enabled: true } : method === 'POST' ? {} : undefined,
      });
      expect(res.status, `${method} ${path}`).toBe(404);
    }
    const denied = await s.c.db('audit_logs').where({ user_id: eve.id, action: 'webhooks.deny_access' });
    expect(denied.length).toBeGreaterThanOrEqual(6);

    expect((await s.api('DELETE', `/webhooks/${hook.webhook_id}`, { token: u.token })).status).toBe(204);
    expect((await s.api('GET', `/webhooks/${hook.webhook_id}`, { token: u.token })).status).toBe(404);
    const actions = (await s.c.db('audit_logs').where({ user_id: u.id }).pluck('action')) as string[];
    expect(actions).toEqual(expect.arrayContaining(['webhooks.create', 'webhooks.update', 'webhooks.delete']));
    expect(JSON.stringify(await s.c.db('audit_logs').where({ user_id: u.id }))).not.toContain(hook.secret);
  });

  it('holds the per-account limit under parallel creations', async () => {
    const u = await registerUser(s.api);
    // Subscribed to one rare kind: endpoints that take every event would each be sent every audit row of
    // the account (their creations', 20 × 20), filling the notify queue that later tests deliver through.
    const answers = await Promise.all(
      Array.from({ length: 25 }, (_, i) =>
        s.api('POST', '/webhooks', { token: u.token, body: { url: `http://127.0.0.1:9/${i}`, event_types: ['keys.expired'] } }),
      ),
    );
    expect(answers.filter((a) => a.status === 201)).toHaveLength(20);
    expect(answers.filter((a) => a.status === 409).every((a) => a.body.code === 'webhook_limit_reached')).toBe(true);
  });

  it('stores the secret sealed', async () => {
    const u = await registerUser(s.api);
    const hook = await subscribe(u.token, 'http://127.0.0.1:9/sealed', PINGS_ONLY);
    const row = await s.c.db('webhook_endpoints').where({ id: hook.webhook_id }).first();
    expect(JSON.stringify(row)).not.toContain(hook.secret.slice(6));
  });
});

describe('deliveries', () => {
  it('delivers an account event signed per Standard Webhooks, only to subscribers of its type, and records it', async () => {
    const u = await registerUser(s.api);
    const r = await receiver();
    const other = await receiver();
    const hook = await subscribe(u.token, r.url, { event_types: ['keys.generated'] });
    await subscribe(u.token, other.url, { event_types: ['keys.rotated'] });
    const key = await createKey(s.api, u.token);

    await expect.poll(() => r.received.length, { timeout: 10_000 }).toBe(1);
    const [got] = r.received;
    const event = new Webhook(hook.secret).verify(got.body, signedHeaders(got)) as { type: string; account: string; data: { fingerprint: string }; id: string };
    expect(event).toMatchObject({ type: 'keys.generated', account: u.id, data: { fingerprint: key.fingerprint } });
    expect(got.headers['content-type']).toBe('application/json');
    // A forged body or another secret does not verify.
    expect(() => new Webhook(hook.secret).verify(got.body.replace(u.id, '00000000-0000-4000-8000-000000000000'), signedHeaders(got))).toThrow();
    expect(() => new Webhook('whsec_' + Buffer.alloc(32, 1).toString('base64')).verify(got.body, signedHeaders(got))).toThrow();

    await expect.poll(async () => (await deliveriesOf(u.token, hook.webhook_id))[0]?.state).toBe('succeeded');
    const [d] = await deliveriesOf(u.token, hook.webhook_id);
    expect(d).toMatchObject({ delivery_id: got.headers['webhook-id'], event_id: event.id, event_type: 'keys.generated', attempts: 1 });
    expect(d.attempt_log).toEqual([expect.objectContaining({ status_code: 200, error: null })]);
    expect(other.received).toHaveLength(0);
  });

  it('another process fans out to an endpoint created, changed or deleted after it last looked (no query per event)', async () => {
    const u = await registerUser(s.api);
    // A second container on the same database and Redis: what a worker process sees.
    const other = await createContainer(s.config, { log: s.c.log });
    try {
      const event = (type: 'keys.generated' | 'keys.rotated') => ({
        id: `${Date.now()}-${Math.floor(Math.random() * 1e6)}`,
        type,
        created_at: new Date().toISOString(),
        account: u.id,
        data: {},
      });
      const queries: string[] = [];
      other.db.on('query', (q: { sql: string }) => queries.push(q.sql));
      expect(await fanOut(other, event('keys.generated'))).toBe(0);
      expect(await fanOut(other, event('keys.generated'))).toBe(0);
      // The second event was answered from what the process kept: one look at the endpoints in all.
      expect(queries.filter((q) => q.includes('webhook_endpoints'))).toHaveLength(1);

      const hook = await subscribe(u.token, 'http://127.0.0.1:9/x', { event_types: ['keys.generated'] });
      expect(await fanOut(other, event('keys.generated'))).toBe(1);
      expect(await fanOut(other, event('keys.rotated'))).toBe(0);
      await s.api('PATCH', `/webhooks/${hook.webhook_id}`, { token: u.token, body: { event_types: ['keys.rotated'] } });
      expect(await fanOut(other, event('keys.rotated'))).toBe(1);
      await s.api('PATCH', `/webhooks/${hook.webhook_id}`, { token: u.token, body: { enabled: false } });
      expect(await fanOut(other, event('keys.rotated'))).toBe(0);
      await s.api('PATCH', `/webhooks/${hook.webhook_id}`, { token: u.token, body: { enabled: true } });
      expect(await fanOut(other, event('keys.rotated'))).toBe(1);
      expect((await s.api('DELETE', `/webhooks/${hook.webhook_id}`, { token: u.token })).status).toBe(204);
      expect(await fanOut(other, event('keys.rotated'))).toBe(0);
    } finally {
      await other.close();
    }
  });

  it('delivers events of the schedulers too: a key expiry warning from the expiry sweep', async () => {
    const u = await registerUser(s.api);
    const r = await receiver();
    await subscribe(u.token, r.url, { event_types: ['keys.expiry_warned'] });
    const key = await createKey(s.api, u.token, { expires_in_days: '20' });
    await s.c.jobs.enqueue('expiry-sweep', {});
    await expect.poll(() => r.received.length, { timeout: 10_000 }).toBe(1);
    expect(JSON.parse(r.received[0].body)).toMatchObject({ type: 'keys.expiry_warned', account: u.id, data: { fingerprint: key.fingerprint, lead_days: 30 } });
  });

  it('retries a failing receiver on the schedule with the same webhook-id, then succeeds', async () => {
    const u = await registerUser(s.api);
    const r = await receiver([500, 503, 200]);
    const hook = await subscribe(u.token, r.url, PINGS_ONLY);
    expect((await s.api('POST', `/webhooks/${hook.webhook_id}/test`, { token: u.token })).status).toBe(202);

    await expect.poll(() => r.received.length, { timeout: 10_000 }).toBe(3);
    const ids = new Set(r.received.map((x) => x.headers['webhook-id']));
    expect(ids.size).toBe(1);
    for (const x of r.received) expect(new Webhook(hook.secret).verify(x.body, signedHeaders(x))).toMatchObject({ type: 'webhook.test' });
    // The waits follow WEBHOOK_RETRY_SCHEDULE (200 ms, then 400 ms).
    expect(r.received[1].at - r.received[0].at).toBeGreaterThanOrEqual(180);
    expect(r.received[2].at - r.received[1].at).toBeGreaterThanOrEqual(380);
    await expect.poll(async () => (await deliveriesOf(u.token, hook.webhook_id))[0]?.state).toBe('succeeded');
    const [d] = await deliveriesOf(u.token, hook.webhook_id);
    expect(d.attempts).toBe(3);
    expect(d.attempt_log.map((a: { status_code: number; error: string | null }) => [a.status_code, a.error])).toEqual([
      [500, 'http_500'],
      [503, 'http_503'],
      [200, null],
    ]);
  });

  it('gives up after the last retry, and a redelivery sends the same webhook-id again', async () => {
    const u = await registerUser(s.api);
    const r = await receiver([500]);
    const hook = await subscribe(u.token, r.url, PINGS_ONLY);
    await s.api('POST', `/webhooks/${hook.webhook_id}/test`, { token: u.token });
    await expect.poll(async () => (await deliveriesOf(u.token, hook.webhook_id))[0]?.state, { timeout: 10_000 }).toBe('failed');
    const [d] = await deliveriesOf(u.token, hook.webhook_id);
    expect(d.attempts).toBe(4); // the first try and three retries
    expect(r.received).toHaveLength(4);
    expect(await deliveriesOf(u.token, hook.webhook_id, '?state=failed')).toHaveLength(1);
    expect(await deliveriesOf(u.token, hook.webhook_id, '?state=succeeded')).toHaveLength(0);

    r.answer([204]);
    const again = await s.api('POST', `/webhooks/${hook.webhook_id}/deliveries/${d.delivery_id}/redeliver`, { token: u.token });
    expect(again.status).toBe(202);
    expect(again.body.state).toBe('pending');
    await expect
      .poll(async () => (await s.api('GET', `/webhooks/${hook.webhook_id}/deliveries/${d.delivery_id}`, { token: u.token })).body.state)
      .toBe('succeeded');
    expect(r.received.at(-1)!.headers['webhook-id']).toBe(d.delivery_id);
    r.answer(['hang']);
    expect((await s.api('POST', `/webhooks/${hook.webhook_id}/deliveries/${d.delivery_id}/redeliver`, { token: u.token })).status).toBe(202);
    // Still being tried (the receiver does not answer): a second redelivery is refused rather than doubled.
    expect((await s.api('POST', `/webhooks/${hook.webhook_id}/deliveries/${d.delivery_id}/redeliver`, { token: u.token })).body.code).toBe('delivery_pending');
  });

  it('a 410 Gone answer disables the endpoint: later events are not sent', async () => {
    const u = await registerUser(s.api);
    const r = await receiver([410]);
    const hook = await subscribe(u.token, r.url);
    await createKey(s.api, u.token);
    await expect
      .poll(async () => (await s.api('GET', `/webhooks/${hook.webhook_id}`, { token: u.token })).body)
      .toMatchObject({ enabled: false, disabled_reason: 'gone' });
    expect(r.received).toHaveLength(1);
    await createKey(s.api, u.token, { label: 'second' });
    await new Promise((done) => setTimeout(done, 500));
    expect(r.received).toHaveLength(1);
    expect(await s.c.db('audit_logs').where({ user_id: u.id, action: 'webhooks.disable' })).toHaveLength(1);
    // Enabling it again clears the reason.
    expect((await s.api('PATCH', `/webhooks/${hook.webhook_id}`, { token: u.token, body: { enabled: true } })).body).toMatchObject({
      enabled: true,
      disabled_reason: null,
    });
  });

  it('records a timeout, and never follows a redirect', async () => {
    const u = await registerUser(s.api);
    const slow = await receiver(['hang']);
    const target = await receiver([200]);
    const bouncing = await receiver([302], { location: target.url });
    const a = await subscribe(u.token, slow.url, PINGS_ONLY);
    const b = await subscribe(u.token, bouncing.url, PINGS_ONLY);
    await s.api('POST', `/webhooks/${a.webhook_id}/test`, { token: u.token });
    await s.api('POST', `/webhooks/${b.webhook_id}/test`, { token: u.token });
    await expect.poll(async () => (await deliveriesOf(u.token, a.webhook_id))[0]?.attempt_log[0]?.error, { timeout: 10_000 }).toBe('timeout');
    await expect.poll(async () => (await deliveriesOf(u.token, b.webhook_id))[0]?.attempt_log[0]?.error).toBe('redirect_not_followed');
    expect(target.received).toHaveLength(0);
  });

  it('signs with both secrets during a rotation’s grace period, then with the new one only', async () => {
    const u = await registerUser(s.api);
    const r = await receiver();
    const hook = await subscribe(u.token, r.url, PINGS_ONLY);
    const rotated = await s.api('POST', `/webhooks/${hook.webhook_id}/rotate-secret`, { token: u.token, body: { grace_hours: 1 } });
    expect(rotated.status).toBe(200);
    const fresh = rotated.body.secret as string;
    expect(fresh).not.toBe(hook.secret);
    expect((await s.api('GET', `/webhooks/${hook.webhook_id}`, { token: u.token })).body.secret_rotation_ends_at).toBe(rotated.body.previous_secret_expires_at);

    await s.api('POST', `/webhooks/${hook.webhook_id}/test`, { token: u.token });
    await expect.poll(() => r.received.length).toBe(1);
    const during = r.received[0];
    expect(String(during.headers['webhook-signature']).split(' ')).toHaveLength(2);
    expect(new Webhook(hook.secret).verify(during.body, signedHeaders(during))).toBeTruthy();
    expect(new Webhook(fresh).verify(during.body, signedHeaders(during))).toBeTruthy();

    (s.c.clock as ManualClockFollowingTime).advance(3600_000 + 1000);
    await s.api('POST', `/webhooks/${hook.webhook_id}/test`, { token: u.token });
    await expect.poll(() => r.received.length).toBe(2);
    const after = r.received[1];
    expect(String(after.headers['webhook-signature']).split(' ')).toHaveLength(1);
    expect(() => new Webhook(hook.secret).verify(after.body, signedHeaders(after))).toThrow();
    expect(new Webhook(fresh).verify(after.body, signedHeaders(after))).toBeTruthy();
  });

  it('announces committed audit rows as audit_logs.recorded events', async () => {
    const u = await registerUser(s.api);
    const r = await receiver();
    const hook = await subscribe(u.token, r.url, { event_types: ['audit_logs.recorded'] });
    await s.api('PATCH', `/webhooks/${hook.webhook_id}`, { token: u.token, body: { description: 'changed' } });
    await expect.poll(() => r.received.map((x) => JSON.parse(x.body).data.action), { timeout: 10_000 }).toContain('webhooks.update');
    const event = JSON.parse(r.received.find((x) => JSON.parse(x.body).data.action === 'webhooks.update')!.body);
    expect(event).toMatchObject({
      type: 'audit_logs.recorded',
      account: u.id,
      data: { action: 'webhooks.update', status: 'success', target: hook.webhook_id },
    });
    // Exactly once each, though every API and scheduler process listens.
    const ids = r.received.map((x) => JSON.parse(x.body).data.audit_id);
    expect(new Set(ids).size).toBe(ids.length);
  });
});

describe('destinations', () => {
  it('refuses loopback, private and link-local destinations, literal or after DNS, unless allowed', async () => {
    const strict = await startTestService({ roles: ['web'], env: { WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'false' } });
    try {
      const u = await registerUser(strict.api);
      for (const url of [
        'http://127.0.0.1:8080/x',
        'http://localhost:8080/x',
        'http://[::1]/x',
        'http://[::ffff:127.0.0.1]/x',
        'http://[::127.0.0.1]/x',
        'http://[::ffff:0:10.0.0.1]/',
        'http://[2002:7f00:1::1]/',
        'http://[64:ff9b:1::a00:1]/',
        'http://10.1.2.3/',
        'http://169.254.169.254/latest/meta-data',
        'https://192.168.0.1/',
        'http://[fe80::1]/',
        'http://0.0.0.0/',
      ]) {
        const res = await strict.api('POST', '/webhooks', { token: u.token, body: { url } });
        expect([res.status, res.body.code], url).toEqual([422, 'address_not_allowed']);
      }
      for (const url of ['ftp://example.com/x', 'file:///etc/passwd', 'not a url', 'https://user:pw@example.com/']) {
        const res = await strict.api('POST', '/webhooks', { token: u.token, body: { url } });
        expect([res.status, res.body.code], url).toEqual([422, 'invalid_url']);
      }
      expect(await strict.c.db('webhook_endpoints')).toHaveLength(0);
    } finally {
      await strict.stop();
    }
  });

  it('checks the address again when it connects (after DNS), so a name that turns private is refused', async () => {
    const r = await receiver();
    const options = { timeoutMs: 2000, allowPrivate: false, userAgent: 'test' };
    expect((await postWebhook(`http://localhost:${r.port}/hook`, {}, '{}', options)).error).toBe('address_not_allowed');
    expect((await postWebhook(`http://127.0.0.1:${r.port}/hook`, {}, '{}', options)).error).toBe('address_not_allowed');
    expect(r.received).toHaveLength(0);
    expect((await postWebhook(`http://localhost:${r.port}/hook`, {}, '{}', { ...options, allowPrivate: true })).status).toBe(200);
  });

  it('knows public from private addresses', () => {
    for (const a of ['8.8.8.8', '1.1.1.1', '2606:4700:4700::1111', '::ffff:8.8.8.8', '2002:808:808::1', '64:ff9b::808:808', '2001:4860:4860::8888']) {
      expect(isPublicAddress(a), a).toBe(true);
    }
    for (const a of [
      '127.0.0.1',
      '10.0.0.1',
      '172.16.5.4',
      '192.168.1.1',
      '169.254.169.254',
      '100.64.0.1',
      '0.0.0.0',
      '224.0.0.1',
      '::1',
      '::',
      'fe80::1',
      'fd00::1',
      '::ffff:10.0.0.1',
      '::ffff:7f00:1',
      '64:ff9b::7f00:1',
      'not-an-ip',
    ]) {
      expect(isPublicAddress(a), a).toBe(false);
    }
  });

  it('judges every IPv6 form that can carry an IPv4 address by the address it carries, and refuses the ones that hide it', () => {
    const forms = (v4: string) => {
      const [a, b, c, d] = v4.split('.').map(Number) as [number, number, number, number];
      const hex = `${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
      return [
        `::${v4}`,
        `::${hex}`,
        `::ffff:${v4}`,
        `::ffff:0:${v4}`,
        `::ffff:0:${hex}`,
        `64:ff9b::${v4}`,
        `2002:${hex}::1`,
        `2002:${hex}:ffff::`,
        `0:0:0:0:0:ffff:${v4}`,
      ];
    };
    for (const v4 of ['127.0.0.1', '10.1.2.3', '169.254.169.254', '192.168.0.1', '0.0.0.0']) {
      for (const a of forms(v4)) expect(isPublicAddress(a), a).toBe(false);
    }
    // Local-use NAT64 (RFC 8215) and Teredo put the IPv4 address where a public one cannot be told apart.
    for (const a of ['64:ff9b:1::7f00:1', '64:ff9b:1:2::808:808', '2001::1', '2001:0:4136:e378:8000:63bf:3fff:fdd2']) expect(isPublicAddress(a), a).toBe(false);
  });
});
