import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { registerUser, startTestService, type TestService, type ManualClockFollowingTime } from '../support/service';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';
import { readEvents } from '../../lib/event-stream';
import { destroyDueGenerations } from '../../lib/lifecycle/key-lifecycle';

/** Key lifecycle: per-generation usage, retiring generations, scheduled destruction, expiry warnings. */
let s: TestService;
let u: Awaited<ReturnType<typeof registerUser>>;
const DAY = 86_400_000;
const clock = () => s.c.clock as ManualClockFollowingTime;

beforeAll(async () => {
  s = await startTestService();
  u = await registerUser(s.api);
});
afterAll(async () => {
  await s?.stop();
});

async function withClockAdvanced<T>(ms: number, fn: () => Promise<T>): Promise<T> {
  clock().advance(ms);
  try {
    return await fn();
  } finally {
    clock().advance(-ms);
  }
}

async function rotate(fingerprint: string, token = u.token) {
  const res = await s.api('POST', `/keys/${fingerprint}/rotate`, { token, body: {}, headers: { prefer: 'wait=30' } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.result.new_fingerprint as string;
}

const generations = async (fingerprint: string, token = u.apiKey) => s.api('GET', `/keys/${fingerprint}/generations`, { token });
const settings = (fingerprint: string, body: unknown, token = u.apiKey) => s.api('PATCH', `/keys/${fingerprint}/settings`, { token, body });
const decrypt = (fingerprint: string, data: Buffer, token = u.apiKey) =>
  runJob(s.api, token, '/keys/decrypt', { fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f.gpg', data }] });

describe('generations and their usage', () => {
  it('counts files and bytes encrypted, decrypts and rewraps per generation; safe_to_retire after quiet days; another account gets 404', async () => {
    const key = await createKey(s.api, u.token, { label: 'usage' });
    const a = randomBytes(1000);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [
      { name: 'a', data: a },
      { name: 'b', data: randomBytes(24) },
    ]);
    const ct = await download(s.api, u.token, enc.job_id);
    expect((await decrypt(key.fingerprint, ct)).state).toBe('completed');
    const fpr2 = await rotate(key.fingerprint);
    const rw = await runJob(s.api, u.token, '/keys/rewrap', { fingerprint: fpr2, passphrase: PASSPHRASE, files: [{ name: 'a.gpg', data: ct }] });
    expect(rw.state, JSON.stringify(rw.error)).toBe('completed');

    const res = await generations(key.fingerprint);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({
      lineage_id: key.lineage_id,
      fingerprint: fpr2,
      current_generation: 2,
      min_decryption_generation: 1,
      page: 1,
      page_size: 20,
      total: 2,
    });
    const [g2, g1] = res.body.items;
    expect(g2).toMatchObject({
      generation: 2,
      status: 'current',
      safe_to_retire: false,
      usage: { files_encrypted: 0, files_rewrapped_to: 1, files_rewrapped_from: 0 },
    });
    expect(g1).toMatchObject({
      generation: 1,
      fingerprint: key.fingerprint,
      status: 'rotated',
      safe_to_retire: false,
      usage: { files_encrypted: 2, bytes_encrypted: 1024, files_decrypted: 1, files_rewrapped_from: 1, files_rewrapped_to: 0 },
    });
    expect(g1.usage.last_decrypt_at).not.toBeNull();
    expect(g1.rotated_at).not.toBeNull();
    // No decrypt for KEY_RETIRE_SAFE_DAYS (30) since its rotation: safe to retire.
    await withClockAdvanced(31 * DAY, async () => {
      const later = await generations(fpr2);
      expect(later.body.items.map((g: { safe_to_retire: boolean }) => g.safe_to_retire)).toEqual([false, true]);
    });
    const other = await registerUser(s.api);
    expect((await generations(key.fingerprint, other.token)).status).toBe(404);
    expect((await settings(key.fingerprint, { min_decryption_generation: 2 }, other.token)).status).toBe(404);
    expect((await s.api('POST', `/keys/${key.fingerprint}/destruction`, { token: other.token, body: {} })).status).toBe(404);
  });
});

describe('retire and destroy one generation', () => {
  let fpr1: string;
  let fpr2: string;
  let old: Buffer;
  const plain = randomBytes(5000);

  beforeAll(async () => {
    const key = await createKey(s.api, u.token, { label: 'retire' });
    fpr1 = key.fingerprint;
    old = await download(s.api, u.token, (await encrypt(s.api, u.token, fpr1, [{ name: 'p', data: plain }])).job_id);
    fpr2 = await rotate(fpr1);
  });

  it('retire → 409 generation_retired → un-retire → decrypts; the current generation is never retired', async () => {
    expect((await settings(fpr2, { min_decryption_generation: 3 })).status).toBe(422);
    expect((await settings(fpr2, { min_decryption_generation: 0 })).status).toBe(422);
    // JSON's true and null are not numbers (z.coerce.number() read them as 1 and 0).
    expect((await settings(fpr2, { min_decryption_generation: true })).status).toBe(422);
    expect((await settings(fpr2, { min_decryption_generation: '2.0' })).status).toBe(422);
    const set = await settings(fpr2, { min_decryption_generation: 2 });
    expect(set.status).toBe(200);
    expect(set.body).toMatchObject({ min_decryption_generation: 2, current_generation: 2 });
    expect((await generations(fpr2)).body.items[1].status).toBe('retired');
    const refused = await decrypt(fpr2, old);
    expect(refused.state).toBe('failed');
    expect(refused.error.code).toBe('generation_retired');
    expect(refused.error.message).toContain(fpr1);
    const rewrap = await runJob(s.api, u.token, '/keys/rewrap', { fingerprint: fpr2, passphrase: PASSPHRASE, files: [{ name: 'p.gpg', data: old }] });
    expect(rewrap.error?.code).toBe('generation_retired');
    expect((await settings(fpr2, { min_decryption_generation: 1 })).status).toBe(200);
    const ok = await decrypt(fpr2, old);
    expect(ok.state).toBe('completed');
    expect(Buffer.compare(await download(s.api, u.token, ok.job_id), plain)).toBe(0);
    const audit = await s.c.db('audit_logs').where({ user_id: u.id, action: 'keys.update_settings' });
    expect(audit.length).toBe(2);
  });

  it('schedules destruction of a retired generation only; cancel works during the wait; after it the secret is gone and decrypt is 410, destroyed once by two sweeps', async () => {
    const schedule = (body: unknown) => s.api('POST', `/keys/${fpr2}/destruction`, { token: u.apiKey, body });
    expect((await schedule({ generation: 1 })).body.code).toBe('generation_not_retired');
    expect((await schedule({ generation: 2 })).body.code).toBe('generation_not_retired');
    expect((await schedule({ generation: 9 })).status).toBe(404);
    await settings(fpr2, { min_decryption_generation: 2 });
    expect((await schedule({ generation: 1, waiting_days: 3 })).status).toBe(422);
    const first = await schedule({ generation: 1, waiting_days: 7 });
    expect(first.status, JSON.stringify(first.body)).toBe(202);
    expect((await schedule({ generation: 1, waiting_days: 7 })).body.code).toBe('destruction_already_scheduled');
    expect((await settings(fpr2, { min_decryption_generation: 1 })).body.code).toBe('destruction_pending');
    expect((await generations(fpr2)).body.items[1]).toMatchObject({ status: 'pending_destruction', destroy_after: first.body.destroy_after });
    // Cancel during the wait: nothing is destroyed when the wait would have ended.
    const cancel = await s.api('DELETE', `/keys/${fpr2}/destruction?generation=1`, { token: u.apiKey });
    expect(cancel.status, JSON.stringify(cancel.body)).toBe(200);
    expect((await s.api('DELETE', `/keys/${fpr2}/destruction?generation=1`, { token: u.apiKey })).body.code).toBe('destruction_not_scheduled');
    await withClockAdvanced(8 * DAY, async () => expect(await destroyDueGenerations(s.c)).toEqual({ destroyed: 0, postponed: 0 }));
    expect((await generations(fpr2)).body.items[1].status).toBe('retired');

    expect((await schedule({ generation: 1, waiting_days: 7 })).status).toBe(202);
    await withClockAdvanced(6 * DAY, async () => expect((await destroyDueGenerations(s.c)).destroyed).toBe(0));
    await withClockAdvanced(7 * DAY + 60_000, async () => {
      // Two sweeps (two schedulers) at once: one destroys, the other finds it done.
      const runs = await Promise.all([destroyDueGenerations(s.c), destroyDueGenerations(s.c)]);
      expect(runs.reduce((n, r) => n + r.destroyed, 0)).toBe(1);
    });
    const row = await s.c.db('pgp_keys').where({ fingerprint: fpr1 }).first();
    expect(row.secret_sealed).toBe('');
    expect(row.private_sealed).toBe('');
    expect(row.destroyed_at).not.toBeNull();
    expect(row.public_armored).toContain('PUBLIC KEY');
    const events = (await readEvents(s.c.redis, s.config.redisPrefix, u.id)).filter(
      (e) => e.type.startsWith('keys.destruction') || e.type === 'keys.generation_destroyed',
    );
    expect(events.map((e) => e.type)).toEqual([
      'keys.destruction_scheduled',
      'keys.destruction_cancelled',
      'keys.destruction_scheduled',
      'keys.generation_destroyed',
    ]);
    expect(events[3].data).toMatchObject({ fingerprint: fpr1, generation: 1 });
    expect((await s.c.db('audit_logs').where({ action: 'keys.destroy_generation', target: fpr1 })).length).toBe(1);

    await settings(fpr2, { min_decryption_generation: 2 });
    const gone = await decrypt(fpr2, old);
    expect(gone.state).toBe('failed');
    expect(gone.error.code).toBe('generation_destroyed');
    expect((await settings(fpr2, { min_decryption_generation: 1 })).body.code).toBe('generation_destroyed');
    expect((await s.api('DELETE', `/keys/${fpr2}/destruction?generation=1`, { token: u.apiKey })).status).toBe(410);
    expect((await generations(fpr2)).body.items[1].status).toBe('destroyed');
    // The current generation still works, and a passphrase change skips the destroyed secret.
    const fresh = await download(s.api, u.token, (await encrypt(s.api, u.token, fpr2, [{ name: 'q', data: plain }])).job_id);
    expect((await decrypt(fpr2, fresh)).state).toBe('completed');
  });
});

describe('destroying a whole key', () => {
  it('disables it at once, waits for jobs that need it, then destroys every generation; its shares answer 410', async () => {
    const key = await createKey(s.api, u.token, { label: 'whole' });
    const share = await s.api('POST', '/keys/share/create', { token: u.token, body: { fingerprint: key.fingerprint } });
    expect(share.status, JSON.stringify(share.body)).toBe(201);
    const res = await s.api('POST', `/keys/${key.fingerprint}/destruction`, { token: u.apiKey, body: { waiting_days: 7 } });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
    expect(res.body).toMatchObject({ scope: 'key', generation: null });
    expect(res.body.key.disabled_at).not.toBeNull();
    const refused = await s.api('POST', '/keys/encrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, files: [{ name: 'x', data: randomBytes(10) }] },
    });
    expect(refused.body.code).toBe('key_disabled');
    expect((await s.api('GET', `/keys/share/${share.body.share_token}`, {})).status).toBe(410);

    // A job that still needs the key (queued or running) holds the destruction back.
    const lineage = await s.c.db('key_lineages').where({ id: key.lineage_id }).first();
    const jobId = (await import('node:crypto')).randomUUID();
    await s.c.db('jobs').insert({
      id: jobId,
      user_id: u.id,
      kind: 'decrypt',
      state: 'active',
      request: JSON.stringify({ lineage_id: lineage.id, fingerprint: key.fingerprint }),
    });
    await withClockAdvanced(8 * DAY, async () => expect(await destroyDueGenerations(s.c)).toEqual({ destroyed: 0, postponed: 1 }));
    expect((await s.c.db('pgp_keys').where({ lineage_id: key.lineage_id }).first()).destroyed_at).toBeNull();
    await s.c.db('jobs').where({ id: jobId }).update({ state: 'completed' });
    await withClockAdvanced(8 * DAY, async () => expect((await destroyDueGenerations(s.c)).destroyed).toBe(1));
    expect((await s.c.db('key_lineages').where({ id: key.lineage_id }).first()).destroyed_at).not.toBeNull();
    const view = await s.api('GET', `/keys/share/${share.body.share_token}`, {});
    expect(view.status).toBe(410);
    expect(view.body.code).toBe('key_destroyed');
    expect((await s.api('DELETE', `/keys/${key.fingerprint}/destruction`, { token: u.apiKey })).status).toBe(410);
  });

  it('a whole-key destruction can be cancelled; the key stays disabled', async () => {
    const key = await createKey(s.api, u.token, { label: 'whole2' });
    expect((await s.api('POST', `/keys/${key.fingerprint}/destruction`, { token: u.apiKey, body: {} })).body.destroy_after).toBeDefined();
    const cancel = await s.api('DELETE', `/keys/${key.fingerprint}/destruction`, { token: u.apiKey });
    expect(cancel.status).toBe(200);
    expect(cancel.body.key).toMatchObject({ destroy_after: null });
    expect(cancel.body.key.disabled_at).not.toBeNull();
    await withClockAdvanced(31 * DAY, async () => expect((await destroyDueGenerations(s.c)).destroyed).toBe(0));
  });
});

describe('expiry warnings and jobs to keys about to expire', () => {
  it('warns at each lead time once per generation, and refuses jobs the key would not outlive', async () => {
    const v = await registerUser(s.api);
    const key = await createKey(s.api, v.token, { label: 'exp', expires_in_days: '40' });
    const sweep = async () => {
      const id = await s.c.jobs.enqueue('expiry-sweep', {});
      await expect.poll(async () => (await s.c.jobs.queue('maintenance').getJob(id))?.finishedOn !== undefined, { timeout: 10_000 }).toBe(true);
    };
    const warnings = async () =>
      (await readEvents(s.c.redis, s.config.redisPrefix, v.id)).filter((e) => e.type === 'keys.expiry_warned').map((e) => e.data.lead_days);
    await sweep();
    expect(await warnings()).toEqual([]);
    await withClockAdvanced(11 * DAY, async () => {
      await sweep();
      await sweep();
    });
    expect(await warnings()).toEqual([30]);
    await withClockAdvanced(20 * DAY, sweep); // 20 days left: nothing new
    expect(await warnings()).toEqual([30]);
    await withClockAdvanced(34 * DAY, sweep); // 6 days left: 14 passed unseen, 7 is the nearest
    expect(await warnings()).toEqual([30, 7]);
    await withClockAdvanced(39.5 * DAY, async () => {
      await sweep();
      // 12 hours left, more than a job may run (JOB_TIMEOUT_SECONDS, 6 h): still encrypts…
      const ok = await s.api('POST', '/keys/encrypt', {
        token: v.apiKey,
        form: { fingerprint: key.fingerprint, files: [{ name: 'x', data: randomBytes(10) }] },
      });
      expect(ok.status).not.toBe(409);
    });
    expect(await warnings()).toEqual([30, 7, 1]);
    await withClockAdvanced(40 * DAY - 3600_000, async () => {
      // …one hour left: an encrypt or rewrap job could outlive it, so it is refused up front.
      const enc = await s.api('POST', '/keys/encrypt', {
        token: v.apiKey,
        form: { fingerprint: key.fingerprint, files: [{ name: 'x', data: randomBytes(10) }] },
      });
      expect(enc.status).toBe(409);
      expect(enc.body.code).toBe('key_expires_during_job');
      const res = await s.api('POST', '/keys/rewrap', {
        token: v.apiKey,
        form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'x.gpg', data: randomBytes(10) }] },
      });
      expect(res.status).toBe(409);
      expect(res.body.code).toBe('key_expires_during_job');
    });
    expect(await s.c.db('key_expiry_warnings').whereIn('key_id', s.c.db('pgp_keys').select('id').where({ lineage_id: key.lineage_id }))).toHaveLength(4);
  });
});
