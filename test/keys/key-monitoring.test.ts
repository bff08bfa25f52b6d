import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { registerUser, startTestService, type ManualClockFollowingTime, type TestService } from '../support/service';
import { PASSPHRASE, createKey, download, encrypt, runJob } from '../support/keys';

/** GET /keys/health and GET /keys/{key_id}/metrics: administrators' view across accounts. */
let s: TestService;
let admin: Awaited<ReturnType<typeof registerUser>>;
beforeAll(async () => {
  s = await startTestService();
  admin = await registerUser(s.api);
  await s.c.db('users').where({ id: admin.id }).update({ role: 'admin' }); // as `npm run admin -- grant` does
});
afterAll(async () => {
  await s?.stop();
});

describe('key monitoring', () => {
  it('is for administrators only', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    for (const path of ['/keys/health', `/keys/${key.lineage_id}/metrics`]) {
      expect((await s.api('GET', path)).status).toBe(401);
      expect((await s.api('GET', path, { token: u.token })).status).toBe(403);
      expect((await s.api('GET', path, { token: u.apiKey })).status).toBe(403);
    }
  });

  it('counts keys by state, rotations due and overdue and expiries; and one key by key_id', async () => {
    const u = await registerUser(s.api);
    const before = (await s.api('GET', '/keys/health', { token: admin.token })).body;
    const a = await createKey(s.api, u.token, { label: 'a' });
    const b = await createKey(s.api, u.token, { label: 'b', expires_in_days: '10' });
    await s.api('POST', '/keys/disable-key', { token: u.token, body: { fingerprint: a.fingerprint } });
    const after = (await s.api('GET', '/keys/health', { token: admin.token })).body;
    expect(after.total - before.total).toBe(2);
    expect(after.disabled - before.disabled).toBe(1);
    expect(after.expiring_14d - before.expiring_14d).toBe(1);
    expect(after.expiring_30d - before.expiring_30d).toBe(1);

    // A rotation policy of one day, and the clock two days on: due, and overdue.
    await s.api('POST', '/profile/update-rotation-days', { token: u.token, body: { rotation_interval_days: 1 } });
    const clock = s.c.clock as ManualClockFollowingTime;
    clock.advance(2 * 86400_000);
    try {
      // Two days on, sessions have expired: the admin's API key works on admin routes.
      // SPEC names a key by its fingerprint; the lineage id answers the same.
      const one = (await s.api('GET', `/keys/health?key_id=${b.fingerprint.toUpperCase()}`, { token: admin.apiKey })).body;
      expect((await s.api('GET', `/keys/health?key_id=${b.lineage_id}`, { token: admin.apiKey })).body).toEqual(one);
      expect(one).toMatchObject({
        lineage_id: b.lineage_id,
        account: u.id,
        status: 'active',
        rotation_interval_days: 1,
        rotation_due: true,
        rotation_overdue: true,
        expires_in_days: 7,
      });
      expect((await s.api('GET', `/keys/health?key_id=${a.fingerprint}`, { token: admin.apiKey })).body).toMatchObject({
        status: 'disabled',
        rotation_due: false,
      });
    } finally {
      clock.advance(-2 * 86400_000);
    }
    expect((await s.api('GET', `/keys/health?key_id=${crypto.randomUUID()}`, { token: admin.token })).status).toBe(404);
    const unknown = await s.api('GET', `/keys/health?key_id=${'0'.repeat(40)}`, { token: admin.token });
    expect([unknown.status, unknown.body.code]).toEqual([404, 'key_not_found']);
    expect((await s.api('GET', '/keys/health?key_id=not-a-key', { token: admin.token })).status).toBe(422);
  });

  it("reports one key's operations, bytes, rotations, generations and job latencies", async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const data = randomBytes(5000);
    const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'm.bin', data }]);
    const dec = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'm.gpg', data: await download(s.api, u.token, enc.job_id) }],
    });
    expect(dec.state).toBe('completed');
    await s.api('POST', '/keys/decrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, passphrase: 'a wrong passphrase', files: [{ name: 'm.gpg', data }] },
    });
    expect((await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, headers: { prefer: 'wait=30' }, body: {} })).status).toBe(200);

    // Any generation's fingerprint names the key (the first one here, rotated since); so does the lineage id.
    const m = await s.api('GET', `/keys/${key.fingerprint}/metrics`, { token: admin.token });
    expect(m.status).toBe(200);
    expect(m.body.lineage_id).toBe(key.lineage_id);
    const current = m.body.generations[0].fingerprint as string;
    expect((await s.api('GET', `/keys/${current}/metrics`, { token: admin.token })).body.generations).toEqual(m.body.generations);
    expect((await s.api('GET', `/keys/${key.lineage_id}/metrics`, { token: admin.token })).body.lineage_id).toBe(key.lineage_id);
    expect((await s.api('GET', `/keys/${'0'.repeat(40)}/metrics`, { token: admin.token })).status).toBe(404);
    expect(m.body.operations).toEqual(
      expect.arrayContaining([
        { action: 'keys.encrypt', status: 'success', count: 1 },
        { action: 'keys.decrypt', status: 'success', count: 1 },
        { action: 'keys.decrypt', status: 'failure', count: 1 },
        { action: 'keys.rotate', status: 'success', count: 1 },
      ]),
    );
    expect(m.body.rotations).toEqual([{ status: 'succeeded', count: 1 }]);
    expect(m.body.generations.map((g: { generation: number; status: string }) => [g.generation, g.status])).toEqual([
      [2, 'active'],
      [1, 'rotated'],
    ]);
    expect(m.body.bytes_processed).toBeGreaterThanOrEqual(5000);
    expect(m.body.last_used_at).toBeTruthy();
    const kinds = m.body.job_latency.map((j: { kind: string }) => j.kind);
    expect(kinds).toEqual(expect.arrayContaining(['decrypt', 'encrypt', 'rotate-key']));
    for (const j of m.body.job_latency) expect(j.p95_ms).toBeGreaterThanOrEqual(j.p50_ms);
    expect((await s.api('GET', `/keys/${crypto.randomUUID()}/metrics`, { token: admin.token })).status).toBe(404);
  });
});
