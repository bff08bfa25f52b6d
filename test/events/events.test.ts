import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes, randomUUID } from 'node:crypto';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createKey, encrypt } from '../support/keys';
import { startProcess, waitForOutput } from '../support/process';
import { Webhook } from 'standardwebhooks';
import { emitEvent } from '../../lib/events';
import { eventStream } from '../../lib/event-stream';
import { watchJobEnd } from '../../lib/jobs/job-records';
import { signedHeaders, startReceiver } from '../support/webhook-receiver';

/** Account events: live over SSE, resumable on another API process, per account, and listed. */
let s: TestService;
let other: ReturnType<typeof startProcess>;
let otherUrl: string;

beforeAll(async () => {
  s = await startTestService();
  other = startProcess('web', { ...s.env, LOG_LEVEL: 'info' });
  await waitForOutput(other, 'api listening');
  const port = /"port":(\d+)/.exec(other.output())![1];
  otherUrl = `http://127.0.0.1:${port}/api/v1`;
});
afterAll(async () => {
  other?.kill('SIGTERM');
  await other?.exited;
  await s?.stop();
});

interface Frame {
  id?: string;
  event?: string;
  data?: string;
  retry?: string;
}

/** A minimal SSE client: collects frames until closed. */
function subscribe(base: string, token: string, opts: { lastEventId?: string; query?: string } = {}) {
  const controller = new AbortController();
  const frames: Frame[] = [];
  let raw = '';
  const headers: Record<string, string> = { authorization: `Bearer ${token}`, accept: 'text/event-stream' };
  if (opts.lastEventId) headers['last-event-id'] = opts.lastEventId;
  const done = fetch(`${base}/events${opts.query ?? ''}`, { headers, signal: controller.signal })
    .then(async (res) => {
      if (res.status !== 200) throw new Error(`GET /events answered ${res.status}: ${await res.text()}`);
      const decoder = new TextDecoder();
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        raw += decoder.decode(chunk, { stream: true });
        let cut;
        while ((cut = raw.indexOf('\n\n')) >= 0) {
          const block = raw.slice(0, cut);
          raw = raw.slice(cut + 2);
          const frame: Frame = {};
          for (const line of block.split('\n')) {
            if (line.startsWith(':')) continue;
            const at = line.indexOf(': ');
            if (at > 0) frame[line.slice(0, at) as keyof Frame] = line.slice(at + 2);
          }
          if (Object.keys(frame).length) frames.push(frame);
        }
      }
    })
    .catch((err: unknown) => {
      if ((err as Error).name !== 'AbortError') throw err;
    });
  const events = () =>
    frames.filter((f) => f.id).map((f) => JSON.parse(f.data!) as { id: string; type: string; account: string; data: Record<string, unknown> });
  return {
    frames,
    events,
    async until(n: number, timeout = 10_000) {
      await expect.poll(() => events().length, { timeout, interval: 20 }).toBeGreaterThanOrEqual(n);
      return events();
    },
    async close() {
      controller.abort();
      await done;
    },
  };
}

/** Key and job events only: audit_logs.recorded events arrive too, a moment later (see webhooks.test.ts). */
const KEYS_AND_JOBS = '?types=keys.generated,keys.rotated,keys.disabled,jobs.completed,jobs.failed';

const rotate = (token: string, fingerprint: string) => s.api('POST', `/keys/${fingerprint}/rotate`, { token, headers: { prefer: 'wait=30' }, body: {} });

describe('GET /events', () => {
  it('delivers live events, and a client that reconnects to another API process with Last-Event-ID gets exactly what it missed', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const live = subscribe(s.url, u.token, { query: KEYS_AND_JOBS });
    await expect.poll(() => live.frames.some((f) => f.retry), { timeout: 5000 }).toBe(true);
    expect((await rotate(u.token, key.fingerprint)).status).toBe(200);
    const [rotated] = await live.until(1);
    expect(rotated).toMatchObject({ type: 'keys.rotated', account: u.id, data: { lineage_id: key.lineage_id, old_fingerprint: key.fingerprint } });
    expect(JSON.stringify(rotated)).not.toMatch(/passphrase|sealed|secret/);
    await live.close();

    // While disconnected: another rotation and a disable.
    expect((await rotate(u.token, key.fingerprint)).status).toBe(200);
    expect((await s.api('POST', '/keys/disable-key', { token: u.token, body: { fingerprint: key.fingerprint } })).status).toBe(200);

    const resumed = subscribe(otherUrl, u.token, { lastEventId: rotated.id, query: KEYS_AND_JOBS });
    const missed = await resumed.until(4);
    expect(missed.map((e) => e.type)).toEqual(['jobs.completed', 'keys.rotated', 'jobs.completed', 'keys.disabled']);
    // Then live on that process too.
    await encrypt(s.api, u.token, (await createKey(s.api, u.token, { label: 'second' })).fingerprint, [{ name: 'a.bin', data: randomBytes(10) }]);
    const later = await resumed.until(6);
    expect(later.slice(4).map((e) => e.type)).toEqual(['keys.generated', 'jobs.completed']);
    await resumed.close();
  });

  it("never carries another account's events, and filters by type", async () => {
    const a = await registerUser(s.api);
    const b = await registerUser(s.api);
    const onlyJobs = subscribe(s.url, a.token, { query: '?types=jobs.completed,jobs.failed' });
    const bStream = subscribe(s.url, b.token);
    await expect.poll(() => onlyJobs.frames.length && bStream.frames.length, { timeout: 5000 }).toBeTruthy();
    const key = await createKey(s.api, a.token);
    await encrypt(s.api, a.token, key.fingerprint, [{ name: 'a.bin', data: randomBytes(10) }]);
    const events = await onlyJobs.until(1);
    expect(events.map((e) => e.type)).toEqual(['jobs.completed']);
    await new Promise((r) => setTimeout(r, 300));
    // b's stream may carry b's own events (its registration's audit row is relayed asynchronously), never a's.
    expect(bStream.events().filter((e) => e.account !== b.id || e.type.startsWith('jobs.') || e.type.startsWith('keys.'))).toEqual([]);
    await onlyJobs.close();
    await bStream.close();
  });

  it('says so when the resume point is older than what the stream keeps (no silent gap), and refuses a malformed Last-Event-ID', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const [first] = (await s.api('GET', '/events/history?types=keys.generated', { token: u.token })).body.items;
    expect(first.type).toBe('keys.generated');
    await rotate(u.token, key.fingerprint);
    await s.c.redis.xtrim(eventStream(s.config.redisPrefix, u.id, false), 'MAXLEN', 0);
    const resumed = subscribe(s.url, u.token, { lastEventId: first.id });
    await expect.poll(() => resumed.frames.some((f) => f.event === 'gap'), { timeout: 5000 }).toBe(true);
    await resumed.close();
    const bad = await fetch(`${s.url}/events`, { headers: { authorization: `Bearer ${u.token}`, 'last-event-id': 'nope' } });
    expect(bad.status).toBe(422);
    expect((await fetch(`${s.url}/events`)).status).toBe(401);
  });
});

describe('job outcomes', () => {
  it("a job's completion reaches a live SSE client and a signed webhook", async () => {
    const u = await registerUser(s.api);
    const receiver = await startReceiver();
    try {
      const hook = (await s.api('POST', '/webhooks', { token: u.token, body: { url: receiver.url, event_types: ['jobs.completed'] } })).body;
      const live = subscribe(s.url, u.token, { query: '?types=jobs.completed' });
      await expect.poll(() => live.frames.some((f) => f.retry), { timeout: 5000 }).toBe(true);
      const key = await createKey(s.api, u.token);
      const job = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'a.bin', data: randomBytes(10) }]);
      const [sse] = await live.until(1);
      expect(sse).toMatchObject({ type: 'jobs.completed', data: { job_id: job.job_id } });
      await expect.poll(() => receiver.received.length, { timeout: 10_000 }).toBe(1);
      const hooked = new Webhook(hook.secret).verify(receiver.received[0].body, signedHeaders(receiver.received[0]));
      expect(hooked).toEqual(sse);
      await live.close();
    } finally {
      await receiver.close();
    }
  });
});

describe('watching for the end of a job (Prefer: wait)', () => {
  it('keeps an end that arrives while nobody waits, and gives up after its time otherwise', async () => {
    const u = await registerUser(s.api);
    const jobId = randomUUID();
    const watch = await watchJobEnd(s.c, u.id, jobId);
    try {
      expect(await watch.next(50)).toBe(false);
      await emitEvent(s.c, u.id, 'jobs.completed', { job_id: randomUUID(), kind: 'encrypt', state: 'completed' }); // another job
      await emitEvent(s.c, u.id, 'jobs.completed', { job_id: jobId, kind: 'encrypt', state: 'completed' });
      await new Promise((resolve) => setTimeout(resolve, 300)); // delivered while no `next` is pending
      const asked = Date.now();
      expect(await watch.next(5000)).toBe(true);
      expect(Date.now() - asked).toBeLessThan(1000);
      expect(await watch.next(50)).toBe(false); // used up
    } finally {
      watch.stop();
    }
  });
});

describe('GET /events/history', () => {
  it('pages newest first and filters by type and time', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    await rotate(u.token, key.fingerprint);
    await rotate(u.token, key.fingerprint);
    const all = (await s.api('GET', `/events/history${KEYS_AND_JOBS}&page_size=2`, { token: u.token })).body;
    // keys.generated, then per rotation job: keys.rotated and jobs.completed.
    expect(all.total).toBe(5);
    expect(all.items.map((e: { type: string }) => e.type)).toEqual(['jobs.completed', 'keys.rotated']);
    const generated = (await s.api('GET', '/events/history?types=keys.generated', { token: u.token })).body;
    expect(generated.items).toHaveLength(1);
    // Each of those changes wrote an audit row, announced as audit_logs.recorded.
    await expect
      .poll(async () =>
        (await s.api('GET', '/events/history?types=audit_logs.recorded', { token: u.token })).body.items.map(
          (e: { data: { action: string } }) => e.data.action,
        ),
      )
      .toEqual(expect.arrayContaining(['keys.generate', 'keys.rotate']));
    const future = (await s.api('GET', `/events/history?from=${new Date(Date.now() + 60_000).toISOString()}`, { token: u.token })).body;
    expect(future.total).toBe(0);
    expect((await s.api('GET', '/events/history?types=nope', { token: u.token })).status).toBe(422);
    expect((await s.api('GET', '/events/history?from=0', { token: u.token })).status).toBe(422);
    expect((await s.api('GET', '/events/history?to=2026', { token: u.token })).status).toBe(422);
  });
});
