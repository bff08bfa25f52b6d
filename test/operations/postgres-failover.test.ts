import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { Queue } from 'bullmq';
import pg from 'pg';
import { createDb } from '../../db/knex';
import { migrateLatest } from '../../db/migrate';
import { bullPrefix } from '../../jobs/client';
import { apiClient, registerUser, removeRedisKeys, type ApiClient } from '../support/service';
import { PASSPHRASE, createKey, download, waitJob } from '../support/keys';
import { startProcess, waitForOutput } from '../support/process';
import { freePort } from '../support/ports';
import { startPostgresPair } from '../support/postgres-pair';
import { startTcpSwitch } from '../support/tcp-switch';
import { heldEncryption } from '../support/held-upload';
import { openEvents } from '../support/sse';

/**
 * The Postgres primary lost, on real processes: a synchronous streaming standby behind one endpoint (a
 * TCP switch, as a managed Postgres's), two API processes, two workers and a scheduler. While
 * encryptions, decryptions, a rotation, logins and an SSE stream run, the primary is SIGKILLed; after a
 * stand-in for failure detection the standby is promoted and the endpoint switched. Nothing acknowledged
 * before the kill may be lost, no client may see a 500, and uploads that end during the outage are kept;
 * the background work (audit and outbox relays, the reconciler, scheduled rotations) goes on by itself.
 * The times are printed (docs/operations.md quotes them).
 */
const MiB = 1 << 20;
/** What a failure detector takes before the endpoint is switched (a managed Postgres: seconds to a minute). */
const DETECTION_MS = 2000;

type Proc = ReturnType<typeof startProcess>;
const procs = new Set<Proc>();
let dir: string;
let pair: Awaited<ReturnType<typeof startPostgresPair>> | undefined;
let endpoint: Awaited<ReturnType<typeof startTcpSwitch>> | undefined;
let prefix: string;
const apis: { api: ApiClient; base: string }[] = [];
const timings: Record<string, number> = {};

function spawnRole(role: 'web' | 'worker' | 'scheduler', env: Record<string, string>): Proc {
  const p = startProcess(role, env);
  procs.add(p);
  return p;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kms-failover-'));
  pair = await startPostgresPair();
  endpoint = await startTcpSwitch(pair.primaryPort);
  const admin = new pg.Client({ connectionString: pair.url(pair.primaryPort) });
  await admin.connect();
  await admin.query('CREATE DATABASE kms');
  await admin.end();
  const migrator = createDb(pair.url(pair.primaryPort, 'kms'), { max: 1 });
  await migrateLatest(migrator);
  await migrator.destroy();
  prefix = `${inject('runId')}_failover`;
  const env = {
    NODE_ENV: 'test',
    LOG_LEVEL: 'info',
    DATABASE_URL: pair.url(endpoint.port, 'kms'),
    REDIS_URL: inject('redisUrl'),
    REDIS_PREFIX: prefix,
    BLOB_STORE_URL: join(dir, 'blobs'),
    MAIL_DIR: join(dir, 'mail'),
    ARGON2_MEMORY_KIB: '1024',
    LINEAGE_KDF_MEMORY_KIB: '1024',
    WORKER_LOCK_MS: '3000',
    WORKER_STALLED_CHECK_MS: '1000',
    ROTATION_SWEEP_SECONDS: '1',
    JOB_RECONCILE_INTERVAL_SECONDS: '1',
  };
  const ports = [await freePort(), await freePort()];
  const webs = ports.map((port) => spawnRole('web', { ...env, PORT: String(port) }));
  const workers = [spawnRole('worker', env), spawnRole('worker', env)];
  const scheduler = spawnRole('scheduler', env);
  await Promise.all([
    ...webs.map((w) => waitForOutput(w, 'The service is ready', 60_000)),
    ...workers.map((w) => waitForOutput(w, 'workers started', 60_000)),
    waitForOutput(scheduler, 'scheduler started', 60_000),
  ]);
  for (const port of ports) apis.push({ base: `http://127.0.0.1:${port}/api/v1`, api: apiClient(`http://127.0.0.1:${port}/api/v1`) });
}, 180_000);

afterAll(async () => {
  for (const p of procs) p.kill('SIGKILL');
  await Promise.all([...procs].map((p) => p.exited));
  await endpoint?.close();
  await pair?.stop();
  if (prefix) await removeRedisKeys(inject('redisUrl'), prefix);
  if (dir) await rm(dir, { recursive: true, force: true });
  if (Object.keys(timings).length) console.info(`postgres failover timings (ms): ${JSON.stringify(timings)}`);
}, 60_000);

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** Requests sent over and over until stopped: every answer's status, and whether a 503 said Retry-After. */
function steadyTraffic(requests: (() => Promise<{ status: number; headers: Headers }>)[]) {
  const answers: { status: number; retryAfter: boolean; at: number }[] = [];
  let running = true;
  const loops = requests.map(async (send) => {
    while (running) {
      const r = await send().catch(() => undefined);
      if (r) answers.push({ status: r.status, retryAfter: Boolean(r.headers.get('retry-after')), at: Date.now() });
      await new Promise((res) => setTimeout(res, 100));
    }
  });
  return { answers, stop: () => ((running = false), Promise.all(loops)) };
}

/** When each audit row that the account's `audit_logs.recorded` events announced from `from` on was announced (ms), by row id. */
async function announcedAuditRows(api: ApiClient, token: string, from: Date): Promise<Map<number, number>> {
  const announced = new Map<number, number>();
  for (let page = 1; ; page++) {
    const query = `types=audit_logs.recorded&page_size=100&page=${page}&from=${encodeURIComponent(from.toISOString())}`;
    const res = await api('GET', `/events/history?${query}`, { token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    for (const e of res.body.items as { created_at: string; data: { audit_id: number } }[]) announced.set(e.data.audit_id, Date.parse(e.created_at));
    if (page * 100 >= res.body.total) return announced;
  }
}

async function decryptsTo(api: ApiClient, token: string, fingerprint: string, jobId: string, plaintext: Buffer) {
  const dec = await api('POST', '/keys/decrypt', {
    token,
    form: { fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f.gpg', data: await download(api, token, jobId) }] },
  });
  expect(dec.status, JSON.stringify(dec.body)).toBe(202);
  expect((await waitJob(api, token, dec.body.job_id)).state).toBe('completed');
  expect(sha(await download(api, token, dec.body.job_id))).toBe(sha(plaintext));
}

describe('the Postgres primary lost behind one endpoint, with a synchronous standby', () => {
  it('loses nothing acknowledged, answers 503 (never 500) meanwhile, keeps uploads that end in the outage, and is whole again within 15 s', async () => {
    const [a, b] = apis as [(typeof apis)[0], (typeof apis)[0]];
    const u = await registerUser(a.api);
    const key = await createKey(a.api, u.token);
    const sse = openEvents(b.base, u.token);

    // Answered 2xx before the kill: an encryption done, a decryption and a rotation acknowledged, a 16 MiB
    // encryption acknowledged (running when the primary goes).
    const small = randomBytes(64 * 1024);
    const done = await a.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files: [{ name: 's.bin', data: small }] } });
    expect(done.status).toBe(202);
    expect((await waitJob(b.api, u.token, done.body.job_id)).state).toBe('completed');
    const decryption = await b.api('POST', '/keys/decrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 's.bin.gpg', data: await download(a.api, u.token, done.body.job_id) }] },
    });
    expect(decryption.status).toBe(202);
    const big = randomBytes(16 * MiB);
    const bigJob = await a.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files: [{ name: 'big.bin', data: big }] } });
    expect(bigJob.status).toBe(202);
    const rotation = await b.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {} });
    expect([200, 202], JSON.stringify(rotation.body)).toContain(rotation.status);
    const other = await registerUser(b.api);
    // Uploads under way at the kill, ending during the outage.
    const heldData = [randomBytes(8 * MiB), randomBytes(4 * MiB)];
    const held = heldData.map((data, i) => heldEncryption(apis[i].base, u.token, key.fingerprint, data, { 'idempotency-key': `held-${i}-${u.id}` }));
    await Promise.all(held.map((h) => h.started));
    const primary = createDb(pair!.url(pair!.primaryPort, 'kms'), { max: 1 });
    try {
      // Both jobs exist (their first MiB arrived) and wait for the rest of their uploads.
      await expect.poll(async () => (await primary('jobs').where({ user_id: u.id }).whereNull('uploaded_at').pluck('id')).length, { timeout: 10_000 }).toBe(2);
    } finally {
      await primary.destroy();
    }

    const traffic = steadyTraffic([
      () => a.api('POST', '/auth/login', { body: { identifier: other.username, password: other.password } }),
      () => b.api('POST', '/auth/login', { body: { identifier: other.username, password: other.password } }),
      () => b.api('GET', `/jobs/${bigJob.body.job_id}`, { token: u.token }),
      () => a.api('GET', '/keys/list?page_size=10', { token: u.token }),
    ]);
    await new Promise((r) => setTimeout(r, 300));
    const t0 = Date.now();
    await pair!.killPrimary();
    for (const h of held) h.release();
    await new Promise((r) => setTimeout(r, DETECTION_MS));
    await pair!.promote();
    endpoint!.switchTo(pair!.standbyPort);
    const switched = Date.now();
    timings.kill_until_switch = switched - t0;
    // Whole again: a login (reads and writes) answers on both API processes.
    for (const { api } of apis)
      for (;;) {
        const r = await api('POST', '/auth/login', { body: { identifier: other.username, password: other.password } }).catch(() => undefined);
        if (r?.status === 200) break;
        await new Promise((res) => setTimeout(res, 100));
      }
    timings.switch_until_logins = Date.now() - switched;
    const answers = await Promise.all(held.map((h) => h.answer));
    timings.switch_until_held_uploads_answered = Date.now() - switched;
    await traffic.stop();

    expect(timings.switch_until_logins).toBeLessThan(15_000);
    const statuses = traffic.answers.map((r) => r.status);
    expect(
      statuses.filter((s) => s >= 500 && s !== 503),
      JSON.stringify(statuses),
    ).toEqual([]);
    expect(statuses).toContain(503);
    timings.answers_503 = statuses.filter((s) => s === 503).length;
    expect(traffic.answers.filter((r) => r.status === 503 && !r.retryAfter)).toEqual([]);

    // The uploads that ended in the outage were kept: each answered 202 with its job, which completes.
    for (const [i, ans] of answers.entries()) {
      expect(ans.status, JSON.stringify(ans.body)).toBe(202);
      const job = await waitJob(b.api, u.token, ans.body.job_id as string);
      expect([job.state, job.error]).toEqual(['completed', null]);
      await decryptsTo(a.api, u.token, key.fingerprint, job.job_id, heldData[i]);
    }
    // Every job acknowledged before the kill ends once, with the right output.
    expect((await waitJob(b.api, u.token, bigJob.body.job_id)).state).toBe('completed');
    await decryptsTo(b.api, u.token, key.fingerprint, bigJob.body.job_id, big);
    expect((await waitJob(a.api, u.token, decryption.body.job_id)).state).toBe('completed');
    expect(sha(await download(a.api, u.token, decryption.body.job_id))).toBe(sha(small));
    expect((await waitJob(a.api, u.token, rotation.body.job_id)).state).toBe('completed');
    const ends = await a.api('GET', '/events/history?page_size=100&types=job.completed,job.failed', { token: u.token });
    const endsOf = (id: string) => ends.body.items.filter((e: { data: { job_id?: string } }) => e.data.job_id === id).map((e: { type: string }) => e.type);
    for (const id of [bigJob.body.job_id, decryption.body.job_id, rotation.body.job_id, ...answers.map((x) => x.body.job_id as string)])
      expect(endsOf(id), id).toEqual(['jobs.completed']);

    // What was answered 2xx before the kill is on the new primary (the commit waited for the standby).
    const db = createDb(pair!.url(pair!.standbyPort, 'kms'), { max: 1 });
    try {
      expect(await db('users').whereIn('id', [u.id, other.id]).pluck('id')).toHaveLength(2);
      expect((await db('jobs').where({ id: done.body.job_id }).first())?.state).toBe('completed');
      expect(await db('jobs').whereIn('id', [decryption.body.job_id, bigJob.body.job_id, rotation.body.job_id]).pluck('id')).toHaveLength(3);
      expect(await db('pgp_keys').where({ lineage_id: key.lineage_id }).pluck('id')).toHaveLength(2);
      // The scheduler carries on over the new primary: a rotation that falls due happens, once.
      const list = await a.api('GET', '/keys/list?page_size=100', { token: u.token });
      const current = list.body.items.find((k: { lineage_id: string }) => k.lineage_id === key.lineage_id);
      expect((await a.api('POST', `/keys/${current.fingerprint}/rotation-schedule`, { token: u.token, body: { rotation_interval_days: 1 } })).status).toBe(200);
      await db('pgp_keys')
        .where({ lineage_id: key.lineage_id, status: 'active' })
        .update({ created_at: db.raw(`now() - interval '2 days'`) });
      const scheduled = async () =>
        (await b.api('GET', '/keys/rotation-history?page_size=100', { token: u.token })).body.items.filter(
          (r: { trigger: string; status: string }) => r.trigger === 'schedule',
        );
      await expect.poll(async () => (await scheduled()).map((r: { status: string }) => r.status), { timeout: 30_000, interval: 500 }).toEqual(['succeeded']);
      timings.switch_until_scheduled_rotation = Date.now() - switched;

      // The background work goes on over the new primary without an operator. The audit relay announces
      // every audit row written after the switch (logins, the schedule, the rotation), also those that
      // committed before its sessions listened again (it reads them back) ...
      const since = new Date(switched);
      const written = async (userId: string) => (await db('audit_logs').where({ user_id: userId }).where('created_at', '>=', since).pluck('id')).map(Number);
      const lastAnnounced: Record<string, number> = {};
      for (const who of [u, other]) {
        const rows = await written(who.id);
        expect(rows.length, who.username).toBeGreaterThan(0);
        let announced = new Map<number, number>();
        const unannounced = async () => {
          announced = await announcedAuditRows(a.api, who.token, since);
          return rows.filter((id) => !announced.has(id));
        };
        await expect.poll(unannounced, { timeout: 15_000, interval: 500 }).toEqual([]);
        lastAnnounced[who.id] = Math.max(...rows.map((id) => announced.get(id)!));
      }
      // The other account's rows are the logins of the first seconds after the switch: read back.
      timings.switch_until_logins_audit_announced = lastAnnounced[other.id] - switched;
      // ... the outbox relay has published every event written during and after the outage (each job's
      // end once, checked above), so the outbox is empty ...
      await expect.poll(async () => Number((await db('event_outbox').count<{ n: string }>({ n: '*' }).first())?.n), { timeout: 15_000, interval: 500 }).toBe(0);
      timings.switch_until_outbox_empty = Date.now() - switched;
      // ... and the scheduler's reconciler runs (every second here).
      const redis = new Redis(inject('redisUrl'));
      const maintenance = new Queue('maintenance', { connection: redis, prefix: bullPrefix(prefix, 'maintenance', false) });
      try {
        const reconciledAt = async () =>
          Math.min(
            ...(await maintenance.getJobs(['completed'], 0, 100))
              .filter((j) => j.name === 'reconcile-jobs' && (j.finishedOn ?? 0) > switched)
              .map((j) => j.finishedOn!),
          );
        await expect.poll(reconciledAt, { timeout: 15_000, interval: 500 }).toBeLessThan(Infinity);
        timings.switch_until_reconciler_ran = (await reconciledAt()) - switched;
      } finally {
        await maintenance.close();
        redis.disconnect();
      }
    } finally {
      await db.destroy();
    }
    // The audit chain goes on over the new primary, and live events still arrive.
    const verdict = await a.api('GET', '/audit-logs/verify', { token: u.token });
    expect([verdict.status, verdict.body.ok, verdict.body.first_break]).toEqual([200, true, null]);
    await expect
      .poll(() => answers.every((ans) => sse.events.some((e) => e.type === 'jobs.completed' && e.data.data.job_id === ans.body.job_id)), { timeout: 15_000 })
      .toBe(true);
    timings.switch_until_whole = Date.now() - switched;
    await sse.close();
  }, 180_000);
});
