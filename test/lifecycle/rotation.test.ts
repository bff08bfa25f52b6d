import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { registerUser, startTestService, type TestService, type ManualClockFollowingTime } from '../support/service';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';
import { rotateLineage } from '../../lib/lifecycle/rotation';
import { rotateDueKeyProcessor } from '../../workers/jobs/rotate-due-key';
import { readEvents } from '../../lib/event-stream';
import { NO_POOL } from '../../lib/slots';
import { Watchdog } from '../../workers/watchdog';
import { lineageMac } from '../../lib/keys/key-integrity';
import { createLogger } from '../../lib/logger';
import type { Job } from 'bullmq';
import { simpleParser } from 'mailparser';
import type { JobEnvelope } from '../../jobs/define';

let s: TestService;
let u: Awaited<ReturnType<typeof registerUser>>;
const DAY = 86400_000;

beforeAll(async () => {
  s = await startTestService({ roles: ['web', 'worker'] });
  u = await registerUser(s.api);
});
afterAll(async () => {
  await s?.stop();
});

const clock = () => s.c.clock as ManualClockFollowingTime;

async function rotate(fingerprint: string, body: Record<string, string> = {}, token = u.token) {
  const res = await s.api('POST', `/keys/${fingerprint}/rotate`, { token, body, headers: { prefer: 'wait=30' } });
  return res;
}

async function history(fingerprint: string, token = u.token) {
  return (await s.api('GET', `/keys/${fingerprint}/rotation-history`, { token })).body;
}

/** Runs one sweep through the queue and waits for the rotations it enqueued. */
async function sweep() {
  const queue = s.c.jobs.queue('rotation');
  const id = await s.c.jobs.enqueue('rotation-sweep', {});
  await expect.poll(async () => (await queue.getJob(id))?.finishedOn !== undefined, { timeout: 10_000, interval: 50 }).toBe(true);
  await expect
    .poll(async () => (await queue.getJobCounts('waiting', 'active', 'delayed')).waiting + (await queue.getJobCounts('active')).active, {
      timeout: 20_000,
      interval: 50,
    })
    .toBe(0);
}

async function withClockAdvanced<T>(ms: number, fn: () => Promise<T>): Promise<T> {
  clock().advance(ms);
  try {
    return await fn();
  } finally {
    clock().advance(-ms);
  }
}

describe('rotate now', () => {
  it('creates the next generation; old ciphertext still decrypts with the oldest and the newest fingerprint', async () => {
    const key = await createKey(s.api, u.token, { label: 'rotating' });
    const data = randomBytes(50_000);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'old.bin', data }]);
    const ciphertext = await download(s.api, u.token, enc.job_id);

    const first = await rotate(key.fingerprint);
    expect(first.status).toBe(200);
    expect(first.body.state).toBe('completed');
    expect(first.body.result).toMatchObject({ rotated: true, old_fingerprint: key.fingerprint, trigger: 'manual', actor_id: u.id, status: 'succeeded' });
    const second = await rotate(first.body.result.new_fingerprint);
    const newest = second.body.result.new_fingerprint as string;
    expect(new Set([key.fingerprint, first.body.result.new_fingerprint, newest]).size).toBe(3);

    for (const fingerprint of [key.fingerprint, newest]) {
      const dec = await runJob(s.api, u.token, '/keys/decrypt', { fingerprint, passphrase: PASSPHRASE, files: [{ name: 'old.bin.gpg', data: ciphertext }] });
      expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
      expect(Buffer.compare(await download(s.api, u.token, dec.job_id), data)).toBe(0);
    }

    // Encrypting to an old fingerprint uses the current generation, and says so.
    const toOld = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'new.bin', data }]);
    expect(toOld.result.fingerprint_used).toBe(newest);
    const pub = await s.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: key.fingerprint } });
    expect(pub.body).toMatchObject({ fingerprint: newest, requested_fingerprint: key.fingerprint });
    const listed = (await s.api('GET', '/keys/list?label=rotating', { token: u.token })).body.items;
    expect(listed).toHaveLength(1);
    expect(listed[0]).toMatchObject({ fingerprint: newest, generation: 3, status: 'active' });

    const h = await history(key.fingerprint);
    expect(h.total).toBe(2);
    expect(h.items.map((e: { from_generation: number }) => e.from_generation)).toEqual([2, 1]);
    expect((await history(newest)).total).toBe(2);
    const audit = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.rotate', status: 'success' });
    expect(audit.length).toBeGreaterThanOrEqual(2);
  });

  it('changes the passphrase when the current one is given', async () => {
    const key = await createKey(s.api, u.token);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'p.bin', data: randomBytes(100) }]);
    const wrong = await rotate(key.fingerprint, { current_passphrase: 'not the passphrase', new_passphrase: 'a brand new passphrase' });
    expect(wrong.status).toBe(422);
    expect(wrong.body.code).toBe('wrong_passphrase');
    const needsCurrent = await rotate(key.fingerprint, { new_passphrase: 'a brand new passphrase' });
    expect(needsCurrent.status).toBe(422);
    const ok = await rotate(key.fingerprint, { current_passphrase: PASSPHRASE, new_passphrase: 'a brand new passphrase' });
    expect(ok.body.state).toBe('completed');
    const ciphertext = await download(s.api, u.token, enc.job_id);
    const old = await s.api('POST', '/keys/decrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'p.gpg', data: ciphertext }] },
    });
    expect(old.body.code).toBe('wrong_passphrase');
    const dec = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: 'a brand new passphrase',
      files: [{ name: 'p.gpg', data: ciphertext }],
    });
    expect(dec.state).toBe('completed');
  });

  it('refuses a disabled key (409), another account’s key (404) and a malformed fingerprint (422)', async () => {
    const key = await createKey(s.api, u.token);
    const other = await registerUser(s.api);
    for (const [method, path] of [
      ['POST', 'rotate'],
      ['POST', 'rotation-schedule'],
      ['GET', 'rotation-history'],
    ] as const) {
      const res = await s.api(method, `/keys/${key.fingerprint}/${path}`, {
        token: other.token,
        ...(method === 'POST' ? { body: path === 'rotate' ? {} : { rotation_interval_days: 5 } } : {}),
      });
      expect(res.status, path).toBe(404);
    }
    expect((await s.api('GET', `/keys/rotation-history?fingerprint=${key.fingerprint}`, { token: other.token })).status).toBe(404);
    expect((await s.api('POST', '/keys/zzz/rotate', { token: u.token, body: {} })).status).toBe(422);
    await s.api('POST', '/keys/disable-key', { token: u.token, body: { fingerprint: key.fingerprint } });
    const res = await rotate(key.fingerprint);
    expect(res.status).toBe(409);
    expect(res.body.code).toBe('key_disabled');
  });

  it('returns the same job for a repeated Idempotency-Key', async () => {
    const key = await createKey(s.api, u.token);
    const headers = { 'idempotency-key': `rot-${Date.now()}` };
    const a = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers });
    const b = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers });
    expect(b.body.job_id).toBe(a.body.job_id);
  });
});

describe('schedules and policy', () => {
  it('rotates on the key’s schedule with a controllable clock, without the passphrase, which still opens the new generation', async () => {
    const key = await createKey(s.api, u.token, { label: 'scheduled' });
    const set = await s.api('POST', `/keys/${key.fingerprint}/rotation-schedule`, { token: u.token, body: { rotation_interval_days: 7 } });
    expect(set.status).toBe(200);
    expect(set.body).toMatchObject({ mode: 'interval', rotation_interval_days: 7, effective_rotation_interval_days: 7 });
    await sweep();
    expect((await history(key.fingerprint)).total).toBe(0);
    await withClockAdvanced(8 * DAY, sweep);
    const h = await history(key.fingerprint);
    expect(h.total).toBe(1);
    expect(h.items[0]).toMatchObject({ trigger: 'schedule', actor_id: null, status: 'succeeded' });
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 's.bin', data: randomBytes(100) }]);
    expect(enc.result.fingerprint_used).toBe(h.items[0].new_fingerprint);
    const dec = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 's.gpg', data: await download(s.api, u.token, enc.job_id) }],
    });
    expect(dec.state).toBe('completed');
    expect(await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.schedule_rotation' }).first()).toBeTruthy();
  });

  it('rotates by the account policy keys without their own schedule; never keys set to off or disabled', async () => {
    const v = await registerUser(s.api);
    const byPolicy = await createKey(s.api, v.token, { label: 'policy' });
    const off = await createKey(s.api, v.token, { label: 'off' });
    const disabled = await createKey(s.api, v.token, { label: 'disabled' });
    await s.api('POST', `/keys/${off.fingerprint}/rotation-schedule`, { token: v.token, body: { rotation_interval_days: null } });
    await s.api('POST', '/keys/disable-key', { token: v.token, body: { fingerprint: disabled.fingerprint } });
    await s.api('POST', '/profile/update-rotation-days', { token: v.token, body: { rotation_interval_days: 30 } });
    await withClockAdvanced(31 * DAY, sweep);
    const all = await s.api('GET', '/keys/rotation-history', { token: v.token });
    expect(all.body.items.map((e: { old_fingerprint: string; trigger: string }) => [e.old_fingerprint, e.trigger])).toEqual([[byPolicy.fingerprint, 'policy']]);
    const back = await s.api('POST', `/keys/${off.fingerprint}/rotation-schedule`, { token: v.token, body: { use_account_policy: true } });
    expect(back.body).toMatchObject({ mode: 'policy', effective_rotation_interval_days: 30 });
    expect((await s.api('POST', `/keys/${off.fingerprint}/rotation-schedule`, { token: v.token, body: { rotation_interval_days: 0 } })).status).toBe(422);
    expect(
      (await s.api('POST', `/keys/${off.fingerprint}/rotation-schedule`, { token: v.token, body: { rotation_interval_days: 3, use_account_policy: true } }))
        .status,
    ).toBe(422);
  });

  it('rotates a due window exactly once with racing sweeps and racing rotations', async () => {
    const v = await registerUser(s.api);
    const key = await createKey(s.api, v.token, { label: 'race' });
    await s.api('POST', `/keys/${key.fingerprint}/rotation-schedule`, { token: v.token, body: { rotation_interval_days: 1 } });
    await withClockAdvanced(2 * DAY, async () => {
      await Promise.all([sweep(), sweep(), sweep()]);
      const lineage = await s.c.db('pgp_keys').where({ fingerprint: key.fingerprint }).first();
      const outcomes = await Promise.all(
        [1, 2, 3].map(() => rotateLineage(s.c, { lineageId: lineage.lineage_id, fromGeneration: 1, trigger: 'schedule', actorId: null })),
      );
      expect(outcomes.every((o) => !o.rotated)).toBe(true);
    });
    const h = await s.api('GET', `/keys/rotation-history?fingerprint=${key.fingerprint}`, { token: v.token });
    expect(h.body.total).toBe(1);
    const keys = await s.c.db('pgp_keys').where({ lineage_id: h.body.items[0].lineage_id });
    expect(keys.map((k: { generation: number; status: string }) => [k.generation, k.status]).sort()).toEqual([
      [1, 'rotated'],
      [2, 'active'],
    ]);
  });

  it('switches once when rotations of the same generation race to commit', async () => {
    const v = await registerUser(s.api);
    const key = await createKey(s.api, v.token, { label: 'commit race' });
    const { lineage_id } = await s.c.db('pgp_keys').where({ fingerprint: key.fingerprint }).first();
    // All three read generation 1 and make a generation 2 before any commits: the switch decides.
    const outcomes = await Promise.all(
      [1, 2, 3].map(() => rotateLineage(s.c, { lineageId: lineage_id, fromGeneration: 1, trigger: 'schedule', actorId: null })),
    );
    expect(outcomes.filter((o) => o.rotated)).toHaveLength(1);
    const won = outcomes.find((o) => o.rotated)!.entry;
    expect(outcomes.filter((o) => !o.rotated).map((o) => [o.reason, o.entry?.id])).toEqual([
      ['already_rotated', won.id],
      ['already_rotated', won.id],
    ]);
    const keys = await s.c.db('pgp_keys').where({ lineage_id }).orderBy('generation');
    expect(keys.map((k: { generation: number; status: string; fingerprint: string }) => [k.generation, k.status, k.fingerprint])).toEqual([
      [1, 'rotated', key.fingerprint],
      [2, 'active', won.new_fingerprint],
    ]);
    expect(await s.c.db('audit_logs').where({ user_id: v.id, action: 'keys.rotate' }).count({ n: '*' })).toEqual([{ n: 1 }]);
  });

  it('records a rotation that fails for good, audits it and raises an event for the owner', async () => {
    const v = await registerUser(s.api);
    const key = await createKey(s.api, v.token, { label: 'broken' });
    const lineage = await s.c.db('pgp_keys').where({ fingerprint: key.fingerprint }).first();
    // A corrupt lineage public key (MAC'd, as if the service itself stored it): no secret can be sealed to it.
    const broken = { id: lineage.lineage_id, user_id: v.id, unlock_public: 'broken', profile: 'rfc4880' };
    await s.c
      .db('key_lineages')
      .where({ id: lineage.lineage_id })
      .update({ unlock_public: 'broken', unlock_mac: lineageMac(s.c, broken) });
    const job = { attemptsMade: 4, opts: { attempts: 5 } } as unknown as Job<JobEnvelope>;
    await expect(
      rotateDueKeyProcessor.process(
        { lineage_id: lineage.lineage_id, from_generation: 1, trigger: 'policy' },
        { c: s.c, job, log: createLogger('silent'), origin: { request_id: null, ip: null }, watchdog: new Watchdog({ timeoutMs: 60_000 }), slot: NO_POOL },
      ),
    ).rejects.toThrow();
    const h = await history(key.fingerprint, v.token);
    expect(h.items[0]).toMatchObject({ status: 'failed', trigger: 'policy', new_fingerprint: null, error: { code: 'rotation_failed' } });
    const audit = await s.c.db('audit_logs').where({ user_id: v.id, action: 'keys.rotate', status: 'failure' }).first();
    expect(audit).toBeTruthy();
    const events = await readEvents(s.c.redis, s.config.redisPrefix, v.id);
    expect(events.map((e) => e.type)).toContain('keys.rotation_failed');
    const filtered = await s.api('GET', '/keys/rotation-history?status=failed', { token: v.token });
    expect(filtered.body.total).toBe(1);
  });
});

describe('history', () => {
  it('pages and filters the account history by time and trigger', async () => {
    const v = await registerUser(s.api);
    const a = await createKey(s.api, v.token, { label: 'a' });
    const b = await createKey(s.api, v.token, { label: 'b' });
    const before = new Date().toISOString();
    await rotate(a.fingerprint, {}, v.token);
    await rotate(b.fingerprint, {}, v.token);
    const page = await s.api('GET', '/keys/rotation-history?page_size=1', { token: v.token });
    expect(page.body).toMatchObject({ total: 2, page_size: 1 });
    expect((await s.api('GET', `/keys/rotation-history?fingerprint=${a.fingerprint}`, { token: v.token })).body.total).toBe(1);
    expect((await s.api('GET', `/keys/rotation-history?from=${before}&trigger=manual`, { token: v.token })).body.total).toBe(2);
    expect((await s.api('GET', `/keys/rotation-history?to=${before}`, { token: v.token })).body.total).toBe(0);
    expect((await s.api('GET', '/keys/rotation-history?from=yesterday', { token: v.token })).status).toBe(422);
    // ISO 8601 only: new Date() would read '0' and '2020' as years, and a time without offset in the server's zone.
    for (const bad of ['0', '2020', 'Nov%2026%202026', '2026-11-26T10:00:00', '2026-11-26%2010:00Z']) {
      expect((await s.api('GET', `/keys/rotation-history?to=${bad}`, { token: v.token })).status, bad).toBe(422);
    }
    const today = before.slice(0, 10);
    expect((await s.api('GET', `/keys/rotation-history?from=${today}`, { token: v.token })).body.total).toBe(2);
    expect((await s.api('GET', `/keys/rotation-history?to=${before.replace('Z', '%2B00:00')}`, { token: v.token })).body.total).toBe(0);
    expect((await s.api('GET', '/keys/rotation-history', { token: u.token })).body.items.every((e: { lineage_id: string }) => e.lineage_id)).toBe(true);
  });
});

describe('expiry', () => {
  it('warns before expiry (event and email), then refuses to encrypt but still decrypts; rotation renews it', async () => {
    const v = await registerUser(s.api);
    const key = await createKey(s.api, v.token, { label: 'expiring', expires_in_days: '20' });
    const enc = await encrypt(s.api, v.token, key.fingerprint, [{ name: 'e.bin', data: randomBytes(100) }]);
    const ciphertext = await download(s.api, v.token, enc.job_id);
    const runSweep = async () => {
      const id = await s.c.jobs.enqueue('expiry-sweep', {});
      await expect.poll(async () => (await s.c.jobs.queue('maintenance').getJob(id))?.finishedOn !== undefined, { timeout: 10_000 }).toBe(true);
    };
    // Lead times 30, 14, 7 and 1 days (KEY_EXPIRY_WARNING_DAYS): 20 days out, the 30-day warning is due.
    const warnings = async () =>
      (await readEvents(s.c.redis, s.config.redisPrefix, v.id)).filter((e) => e.type === 'keys.expiry_warned').map((e) => e.data.lead_days);
    await runSweep();
    expect(await warnings()).toEqual([30]);
    await withClockAdvanced(10 * DAY, runSweep);
    await withClockAdvanced(11 * DAY, runSweep); // each lead time warned once only
    expect(await warnings()).toEqual([30, 14]);
    const events = (await readEvents(s.c.redis, s.config.redisPrefix, v.id)).filter((e) => e.type === 'keys.expiry_warned');
    expect(events[0].data).toMatchObject({ fingerprint: key.fingerprint, label: 'expiring' });
    await expect
      .poll(
        async () => {
          const files = await readdir(s.env.MAIL_DIR).catch(() => [] as string[]);
          const mails = await Promise.all(files.map(async (f) => simpleParser(await readFile(`${s.env.MAIL_DIR}/${f}`))));
          return mails.some((m) => m.text?.includes(key.fingerprint) && JSON.stringify(m.to).includes(v.email));
        },
        { timeout: 10_000 },
      )
      .toBe(true);

    // Sessions last an hour, so three weeks on only the (90-day) partner API key still works.
    await withClockAdvanced(21 * DAY, async () => {
      const listed = await s.api('GET', '/keys/list?label=expiring', { token: v.apiKey });
      expect(listed.body.items[0]).toMatchObject({ status: 'expired', active: false });
      const refused = await s.api('POST', '/keys/encrypt', {
        token: v.apiKey,
        form: { fingerprint: key.fingerprint, files: [{ name: 'x', data: randomBytes(10) }] },
      });
      expect(refused.status).toBe(409);
      expect(refused.body.code).toBe('key_expired');
      const dec = await runJob(s.api, v.apiKey, '/keys/decrypt', {
        fingerprint: key.fingerprint,
        passphrase: PASSPHRASE,
        files: [{ name: 'e.gpg', data: ciphertext }],
      });
      expect(dec.state).toBe('completed');
    });
    // Rotation gives a fresh generation with a new lifetime (made at wall-clock time, hence outside the window).
    const renewed = await rotate(key.fingerprint, {}, v.token);
    expect(renewed.body.state).toBe('completed');
    const again = await encrypt(s.api, v.token, key.fingerprint, [{ name: 'y', data: randomBytes(10) }]);
    expect(again.result.fingerprint_used).toBe(renewed.body.result.new_fingerprint);
  });
});
