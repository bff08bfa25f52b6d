import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import calculateSlot from 'cluster-key-slot';
import { Redis } from 'ioredis';
import { createDb, dropDatabase, ensureDatabase } from '../../db/knex';
import { QUEUES } from '../../jobs/define';
import { EVENT_STREAM_GROUPS, streamTag } from '../../lib/event-stream';
import { apiClient, registerUser, type ApiClient } from '../support/service';
import { PASSPHRASE, createKey, download, waitJob } from '../support/keys';
import { startS3 } from '../support/s3';
import { startProcess, waitForOutput } from '../support/process';
import { startRedisCluster, type ClusterNodeInfo } from '../support/redis-cluster';
import { freePort } from '../support/ports';
import { startReceiver } from '../support/webhook-receiver';
import { openEvents } from '../support/sse';

/**
 * The service past one machine, on real processes: a Redis Cluster of 3 primaries with a replica each,
 * 2 API processes, 3 worker processes with different queues, 2 schedulers, Postgres and an S3 store.
 * Everything goes through both API processes; then one process of each kind is SIGKILLed in turn and
 * the work must still end exactly once. Recovery times are printed (the capacity model in
 * docs/scale-out.md quotes them).
 */
const MiB = 1 << 20;
const PREFIX = 'kms'; // the cluster is private to this file: the default prefix, so the shard map is the real one

type Proc = ReturnType<typeof startProcess>;
const procs = new Set<Proc>();
let cluster: Awaited<ReturnType<typeof startRedisCluster>>;
let s3: Awaited<ReturnType<typeof startS3>>;
let receiver: Awaited<ReturnType<typeof startReceiver>>;
let dir: string;
let dbUrl: string;
let db: ReturnType<typeof createDb>;
let env: Record<string, string>;
const apis: { proc: Proc; api: ApiClient; base: string; port: number }[] = [];
/** The one process consuming the crypto queue (replaced when it is killed). */
let cryptoWorker: Proc;
const schedulers: Proc[] = [];
const recovery: Record<string, number> = {};

function spawnRole(role: 'web' | 'worker' | 'scheduler', extra: Record<string, string> = {}): Proc {
  const p = startProcess(role, { ...env, ...extra });
  procs.add(p);
  return p;
}

async function startApi(port?: number) {
  const p = port ?? (await freePort());
  const proc = spawnRole('web', { PORT: String(p) });
  await waitForOutput(proc, 'The service is ready', 60_000);
  const base = `http://127.0.0.1:${p}/api/v1`;
  return { proc, api: apiClient(base), base, port: p };
}

const WORKER_QUEUES = { crypto: 'crypto=1', rotation: 'rotation=1,notify=2', rest: 'billing=1,team-sync=1,maintenance=1' } as const;
async function startWorker(kind: keyof typeof WORKER_QUEUES) {
  const proc = spawnRole('worker', { WORKER_QUEUES: WORKER_QUEUES[kind] });
  await waitForOutput(proc, 'workers started', 60_000);
  return proc;
}

async function kill(p: Proc) {
  p.kill('SIGKILL');
  await p.exited;
  procs.delete(p);
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kms-topology-'));
  const id = `${inject('runId')}_topology`;
  const url = new URL(inject('pgBase'));
  url.pathname = `/${id}`;
  dbUrl = url.toString();
  await ensureDatabase(dbUrl, inject('templateDb'));
  db = createDb(dbUrl, { max: 1 });
  // Each kept as soon as it runs, so that afterAll removes it even when another fails to start.
  await Promise.all([startRedisCluster(3).then((c) => (cluster = c)), startS3(dir).then((s) => (s3 = s)), startReceiver().then((r) => (receiver = r))]);
  env = {
    NODE_ENV: 'test',
    LOG_LEVEL: 'info',
    DATABASE_URL: dbUrl,
    REDIS_URL: 'redis://127.0.0.1',
    REDIS_CLUSTER_NODES: cluster.seeds,
    REDIS_PREFIX: PREFIX,
    ...s3.env,
    MAIL_DIR: join(dir, 'mail'),
    ARGON2_MEMORY_KIB: '1024',
    LINEAGE_KDF_MEMORY_KIB: '1024',
    WEBHOOK_ALLOW_PRIVATE_ADDRESSES: 'true',
    LOGIN_MAX_FAILURES: '4',
    // A killed worker's job is taken again within seconds; a job whose upload stopped fails within seconds.
    WORKER_LOCK_MS: '3000',
    WORKER_STALLED_CHECK_MS: '1000',
    JOB_IDLE_SECONDS: '4',
    ROTATION_SWEEP_SECONDS: '1',
  };
  const [api1, api2, crypto] = await Promise.all([startApi(), startApi(), startWorker('crypto'), startWorker('rotation'), startWorker('rest')]);
  apis.push(api1, api2);
  cryptoWorker = crypto;
  schedulers.push(spawnRole('scheduler'), spawnRole('scheduler'));
  await Promise.all(schedulers.map((s) => waitForOutput(s, 'scheduler started', 60_000)));
}, 180_000);

let failed = false;
afterEach(({ task }) => {
  failed ||= task.result?.state === 'fail' || Boolean(task.result?.errors?.length);
});

afterAll(async () => {
  // What the processes warned of is what explains a failure here.
  if (failed)
    for (const p of procs)
      console.info(
        p
          .output()
          .split('\n')
          .filter((l) => /"level":(40|50|60)/.test(l))
          .slice(-30)
          .join('\n'),
      );
  await Promise.all([...procs].map(kill));
  await cluster?.stop();
  await s3?.close();
  await receiver?.close();
  await db?.destroy();
  if (dbUrl) await dropDatabase(dbUrl);
  if (dir) await rm(dir, { recursive: true, force: true });
  if (Object.keys(recovery).length) console.info(`recovery times (ms): ${JSON.stringify(recovery)}`);
}, 60_000);

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** Which primary (by port) serves the slot of `key`. */
function ownerOf(layout: ClusterNodeInfo[], key: string): number {
  const slot = calculateSlot(key);
  const owner = layout.find(
    (n) =>
      n.role === 'master' &&
      n.slots.some((r) => {
        const [a, b = a] = r.split('-').map(Number) as [number, number?];
        return slot >= a && slot <= b;
      }),
  );
  if (!owner) throw new Error(`no primary serves slot ${slot}`);
  return owner.port;
}

/** A multipart encryption request whose file part streams `size` bytes; `onSent` hears the running total. */
function streamingEncrypt(base: string, token: string, fingerprint: string, data: Buffer, idempotencyKey: string, onSent?: (n: number) => void) {
  const boundary = `----kms${randomBytes(8).toString('hex')}`;
  const head = Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="fingerprint"\r\n\r\n${fingerprint}\r\n` +
      `--${boundary}\r\nContent-Disposition: form-data; name="files"; filename="big.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`,
  );
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
  let offset = 0;
  let sent = 0;
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (offset === 0 && sent === 0) {
        controller.enqueue(head);
        sent = head.length;
      }
      if (offset >= data.length) {
        controller.enqueue(tail);
        controller.close();
        return;
      }
      const piece = data.subarray(offset, offset + MiB);
      offset += piece.length;
      sent += piece.length;
      controller.enqueue(piece);
      onSent?.(offset);
      await new Promise((r) => setTimeout(r, 5)); // paced, so a process can be killed mid-upload
    },
  });
  return fetch(`${base}/keys/encrypt`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': `multipart/form-data; boundary=${boundary}`, 'idempotency-key': idempotencyKey },
    body,
    duplex: 'half',
  });
}

/** Retries a request that meets a process or shard being replaced (refused connection, 503) until `ok`. */
async function untilAnswered<T>(what: () => Promise<T>, ok: (r: T) => boolean, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await what().catch((err: unknown) => err as T);
    if (ok(r)) return r;
    if (Date.now() > deadline)
      throw new Error(`no good answer within ${timeoutMs} ms: ${r instanceof Error ? r.message : JSON.stringify((r as { body?: unknown }).body ?? r)}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

/** The lineage's current generation. */
async function currentKey(api: ApiClient, token: string, lineageId: string): Promise<{ fingerprint: string }> {
  const res = await api('GET', '/keys/list?page_size=100', { token });
  expect(res.status).toBe(200);
  return res.body.items.find((k: { lineage_id: string }) => k.lineage_id === lineageId);
}

async function eventIds(api: ApiClient, token: string): Promise<string[]> {
  const res = await api('GET', '/events/history?page_size=100', { token });
  expect(res.status).toBe(200);
  return res.body.items.map((e: { id: string }) => e.id);
}

/** The job's own events in the account's stream (jobs.completed or jobs.failed). */
async function jobEvents(api: ApiClient, token: string, jobId: string): Promise<{ type: string }[]> {
  const res = await api('GET', '/events/history?page_size=100&types=jobs.completed,jobs.failed', { token });
  expect(res.status).toBe(200);
  return res.body.items.filter((e: { data: { job_id?: string } }) => e.data.job_id === jobId);
}

async function makeRotationDue(lineageId: string) {
  await db('pgp_keys')
    .where({ lineage_id: lineageId, status: 'active' })
    .update({ created_at: db.raw(`now() - interval '2 days'`) });
}

async function rotations(api: ApiClient, token: string): Promise<{ trigger: string; status: string; from_generation: number; lineage_id: string }[]> {
  const res = await api('GET', '/keys/rotation-history?page_size=100', { token });
  expect(res.status).toBe(200);
  return res.body.items;
}

describe('the service on a Redis Cluster, 2 API processes, 3 workers and 2 schedulers', () => {
  let u: Awaited<ReturnType<typeof registerUser>>;
  let other: Awaited<ReturnType<typeof registerUser>>;
  let key: { lineage_id: string; fingerprint: string };
  /** The key's current generation (rotations replace it). */
  let currentFp: string;

  it('spreads the queues and the account streams over the shards', async () => {
    const layout = await cluster.layout();
    const shardOf = Object.fromEntries(QUEUES.map((q) => [q, ownerOf(layout, `{${PREFIX}:${q}}`)]));
    const groups = Array.from({ length: EVENT_STREAM_GROUPS }, (_, g) => ownerOf(layout, `{${PREFIX}:events:g${g}}`));
    console.info(
      `queue → primary port: ${JSON.stringify(shardOf)}; event stream groups per primary: ${JSON.stringify(groups.reduce<Record<number, number>>((m, p) => ({ ...m, [p]: (m[p] ?? 0) + 1 }), {}))}`,
    );
    expect(new Set(Object.values(shardOf)).size).toBeGreaterThan(1);
    expect(new Set(groups).size).toBe(3);
    // The schedulers' entries sit in their queues' slots, on those primaries only.
    for (const q of ['maintenance', 'rotation'] as const) {
      const node = new Redis({ port: shardOf[q], host: '127.0.0.1' });
      try {
        expect((await node.keys(`{${PREFIX}:${q}}:*`)).length).toBeGreaterThan(0);
      } finally {
        node.disconnect();
      }
    }
  });

  it('serves accounts, keys, 64 MiB files, rotations, events and webhooks through both API processes', async () => {
    const [a, b] = apis as [(typeof apis)[0], (typeof apis)[0]];
    u = await registerUser(a.api);
    other = await registerUser(b.api);
    const sse = openEvents(b.base, u.token);
    const hook = await b.api('POST', '/webhooks', { token: u.token, body: { url: receiver.url, event_types: ['jobs.completed'] } });
    expect(hook.status, JSON.stringify(hook.body)).toBe(201);
    key = await createKey(a.api, u.token);
    expect((await b.api('POST', '/keys/get-public-key', { token: u.token, body: { fingerprint: key.fingerprint } })).status).toBe(200);

    const data = randomBytes(64 * MiB);
    const enc = await a.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: key.fingerprint, files: [{ name: 'big.bin', data }] } });
    expect(enc.status, JSON.stringify(enc.body)).toBe(202);
    expect((await waitJob(b.api, u.token, enc.body.job_id)).state).toBe('completed');
    const ciphertext = await download(b.api, u.token, enc.body.job_id);
    const dec = await b.api('POST', '/keys/decrypt', {
      token: u.token,
      form: { fingerprint: key.fingerprint, passphrase: PASSPHRASE, files: [{ name: 'big.bin.gpg', data: ciphertext }] },
    });
    expect(dec.status, JSON.stringify(dec.body)).toBe(202);
    expect((await waitJob(a.api, u.token, dec.body.job_id)).state).toBe('completed');
    expect(sha(await download(a.api, u.token, dec.body.job_id))).toBe(sha(data));

    // A rotation now (API 2), and one by schedule: both schedulers sweep, the rotation happens once.
    const rot = await b.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
    expect([200, 202], JSON.stringify(rot.body)).toContain(rot.status);
    expect((await waitJob(a.api, u.token, rot.body.job_id)).state).toBe('completed');
    const current = await currentKey(a.api, u.token, key.lineage_id);
    expect((await a.api('POST', `/keys/${current.fingerprint}/rotation-schedule`, { token: u.token, body: { rotation_interval_days: 1 } })).status).toBe(200);
    await makeRotationDue(key.lineage_id);
    await expect.poll(async () => (await rotations(b.api, u.token)).filter((r) => r.trigger === 'schedule').length, { timeout: 30_000, interval: 500 }).toBe(1);
    await new Promise((r) => setTimeout(r, 3000)); // several more sweeps by both schedulers
    const history = await rotations(a.api, u.token);
    expect(history.map((r) => [r.trigger, r.status])).toEqual([
      ['schedule', 'succeeded'],
      ['manual', 'succeeded'],
    ]);
    currentFp = (await currentKey(a.api, u.token, key.lineage_id)).fingerprint;

    // Events written through API 1's workers reached the SSE client of API 2, in order, once each.
    await expect.poll(() => sse.events.filter((e) => e.type === 'keys.rotated').length, { timeout: 10_000 }).toBe(2);
    const types = sse.events.map((e) => e.type);
    for (const t of ['keys.generated', 'jobs.completed', 'keys.rotated']) expect(types).toContain(t);
    expect(new Set(sse.events.map((e) => e.id)).size).toBe(sse.events.length);
    await sse.close();
    await expect
      .poll(() => receiver.received.filter((r) => JSON.parse(r.body).type === 'jobs.completed').length, { timeout: 20_000 })
      .toBeGreaterThanOrEqual(2);

    // A limit holds across both API processes: failed logins spread over them lock the account.
    for (let i = 0; i < 4; i++)
      expect((await apis[i % 2].api('POST', '/auth/login', { body: { identifier: other.username, password: 'wrong password here' } })).status).toBe(401);
    expect((await a.api('POST', '/auth/login', { body: { identifier: other.username, password: other.password } })).status).toBe(429);
    expect((await b.api('POST', '/auth/login', { body: { identifier: other.username, password: other.password } })).status).toBe(429);
  }, 180_000);

  it('loses a Redis primary: its replica takes over, and work and live events go on without losing what was written', async () => {
    const [a, b] = apis as [(typeof apis)[0], (typeof apis)[0]];
    const victim = ownerOf(await cluster.layout(), `{${PREFIX}:crypto}`);
    // An account whose event stream lives on the same primary: its live SSE reader must follow the failover.
    let w = await registerUser(a.api);
    while (ownerOf(await cluster.layout(), `{${streamTag(PREFIX, w.id, true)}}`) !== victim) w = await registerUser(a.api);
    const wKey = await createKey(a.api, w.token);
    const sse = openEvents(b.base, w.token);
    await sse.opened;
    const before = await eventIds(a.api, w.token);
    expect(before.length).toBeGreaterThan(0);
    await new Promise((r) => setTimeout(r, 500)); // replication is asynchronous: what was acknowledged a moment ago is on the replica
    const t0 = Date.now();
    await cluster.kill(victim);
    const data = randomBytes(MiB);
    const enc = await untilAnswered(
      () => a.api('POST', '/keys/encrypt', { token: w.token, form: { fingerprint: wKey.fingerprint, files: [{ name: 'f.bin', data }] } }),
      (r) => r.status === 202,
    );
    recovery.redis_primary_until_accepted = Date.now() - t0;
    expect((await waitJob(b.api, w.token, enc.body.job_id)).state).toBe('completed');
    recovery.redis_primary_until_job_done = Date.now() - t0;
    await expect.poll(() => sse.events.some((e) => e.type === 'jobs.completed' && e.data.data.job_id === enc.body.job_id), { timeout: 15_000 }).toBe(true);
    recovery.redis_primary_until_live_event = Date.now() - t0;
    await sse.close();
    await cluster.waitHealthy();
    expect((await cluster.layout()).some((n) => n.port === victim)).toBe(false);
    // Nothing written before the failure is gone from the account's stream; the job ended once.
    expect(await eventIds(b.api, w.token)).toEqual(expect.arrayContaining(before));
    expect((await jobEvents(b.api, w.token, enc.body.job_id)).map((e) => e.type)).toEqual(['jobs.completed']);
  }, 120_000);

  it('loses an API process mid-upload: the retry with the same Idempotency-Key becomes one job', async () => {
    const [a, b] = apis as [(typeof apis)[0], (typeof apis)[0]];
    const data = randomBytes(64 * MiB);
    const idem = `upload-${randomBytes(6).toString('hex')}`;
    let t0 = 0;
    const first = streamingEncrypt(a.base, u.token, currentFp, data, idem, (n) => {
      if (n >= 16 * MiB && !t0) {
        t0 = Date.now();
        a.proc.kill('SIGKILL');
      }
    });
    await expect(first).rejects.toThrow();
    await a.proc.exited;
    procs.delete(a.proc);
    const retry = await untilAnswered(
      () => streamingEncrypt(b.base, u.token, currentFp, data, idem).then(async (r) => ({ status: r.status, body: (await r.json()) as { job_id: string } })),
      (r) => r.status === 202,
      90_000,
    );
    recovery.api_process_until_retry_accepted = Date.now() - t0;
    expect((await waitJob(b.api, u.token, retry.body.job_id)).state).toBe('completed');
    recovery.api_process_until_job_done = Date.now() - t0;
    // The same key again answers with that job; the interrupted request's job failed and kept nothing.
    const again = await streamingEncrypt(b.base, u.token, currentFp, data, idem);
    expect(((await again.json()) as { job_id: string }).job_id).toBe(retry.body.job_id);
    const dec = await b.api('POST', '/keys/decrypt', {
      token: u.token,
      form: { fingerprint: currentFp, passphrase: PASSPHRASE, files: [{ name: 'big.bin.gpg', data: await download(b.api, u.token, retry.body.job_id) }] },
    });
    expect((await waitJob(b.api, u.token, dec.body.job_id)).state).toBe('completed');
    expect(sha(await download(b.api, u.token, dec.body.job_id))).toBe(sha(data));
    const jobs = await db('jobs')
      .where({ user_id: u.id })
      .where('created_at', '>', new Date(t0 - 60_000))
      .where({ kind: 'encrypt' })
      .select('id', 'state', 'idempotency_key');
    expect(jobs.filter((j) => j.state === 'completed' && j.id === retry.body.job_id)).toHaveLength(1);
    expect(jobs.filter((j) => j.idempotency_key === idem)).toHaveLength(1);
    expect(jobs.filter((j) => j.state === 'failed')).toHaveLength(1); // the interrupted request's
    // The process comes back (as a supervisor would start it) on its port.
    apis[0] = await startApi(a.port);
  }, 150_000);

  it('loses a crypto worker mid-job: another takes the job, which completes once with the right output', async () => {
    const [a, b] = apis as [(typeof apis)[0], (typeof apis)[0]];
    const data = randomBytes(64 * MiB);
    const enc = await a.api('POST', '/keys/encrypt', { token: u.token, form: { fingerprint: currentFp, files: [{ name: 'big.bin', data }] } });
    expect(enc.status, JSON.stringify(enc.body)).toBe(202);
    await expect
      .poll(async () => (await b.api('GET', `/jobs/${enc.body.job_id}`, { token: u.token })).body.state, { timeout: 30_000, interval: 20 })
      .toBe('active');
    const t0 = Date.now();
    await kill(cryptoWorker);
    cryptoWorker = await startWorker('crypto'); // a supervisor starts it again
    expect((await waitJob(b.api, u.token, enc.body.job_id)).state).toBe('completed');
    recovery.crypto_worker_until_job_done = Date.now() - t0;
    const dec = await a.api('POST', '/keys/decrypt', {
      token: u.token,
      form: { fingerprint: currentFp, passphrase: PASSPHRASE, files: [{ name: 'big.bin.gpg', data: await download(a.api, u.token, enc.body.job_id) }] },
    });
    expect((await waitJob(b.api, u.token, dec.body.job_id)).state).toBe('completed');
    expect(sha(await download(b.api, u.token, dec.body.job_id))).toBe(sha(data));
    expect((await jobEvents(a.api, u.token, enc.body.job_id)).map((e) => e.type)).toEqual(['jobs.completed']);
  }, 150_000);

  it('loses a scheduler: the other one sweeps, and a due rotation happens once', async () => {
    const [a, b] = apis as [(typeof apis)[0], (typeof apis)[0]];
    const t0 = Date.now();
    await kill(schedulers[0]);
    const count = (await rotations(a.api, u.token)).length;
    await makeRotationDue(key.lineage_id);
    // The failover above may have lost the schedule's next iteration (written a moment before the kill):
    // a scheduler asserts its schedules again within a minute.
    await expect.poll(async () => (await rotations(b.api, u.token)).length, { timeout: 75_000, interval: 200 }).toBe(count + 1);
    recovery.scheduler_until_rotation = Date.now() - t0;
    await new Promise((r) => setTimeout(r, 3000)); // more sweeps
    const history = await rotations(a.api, u.token);
    expect(history).toHaveLength(count + 1);
    expect([history[0].trigger, history[0].status]).toEqual(['schedule', 'succeeded']);
  }, 120_000);
});
