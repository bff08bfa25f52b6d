import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { dropDatabase, ensureDatabase } from '../../db/knex';
import { loadConfig } from '../../lib/config';
import { apiClient, login, registerUser, removeRedisKeys, type ApiClient } from '../support/service';
import { PASSPHRASE, createKey, download, waitJob } from '../support/keys';
import { startProcess, waitForOutput } from '../support/process';
import { startPgBouncer } from '../support/pgbouncer';
import { freePort } from '../support/ports';
import { openEvents } from '../support/sse';

/**
 * The service behind PgBouncer in transaction mode (DATABASE_POOL_MODE=transaction): 2 API processes, a
 * worker and a scheduler reach Postgres through 3 server connections that PgBouncer hands to whichever
 * client has a transaction to run, so nothing may live in a session: named prepared statements, startup
 * parameters, session locks. The audit relay listens on DATABASE_DIRECT_URL. Every answer is recorded:
 * none may be a 500, and every rotation asked for makes exactly one generation.
 */
const POOL_SIZE = 3;

type Proc = ReturnType<typeof startProcess>;
const procs: Proc[] = [];
let pgbouncer: Awaited<ReturnType<typeof startPgBouncer>> | undefined;
let dir: string | undefined;
let directUrl: string | undefined;
let env: Record<string, string>;
const statuses: { what: string; status: number; body: unknown }[] = [];
const apis: { api: ApiClient; base: string }[] = [];

/** An API client whose every answer is kept, so that the test can check that none was a 500. */
function recorded(base: string): ApiClient {
  const api = apiClient(base);
  return async (method, path, opts) => {
    const res = await api(method, path, opts);
    statuses.push({ what: `${method} ${path}`, status: res.status, body: res.body });
    return res;
  };
}

function spawnRole(role: 'web' | 'worker' | 'scheduler', extra: Record<string, string> = {}): Proc {
  const p = startProcess(role, { ...env, ...extra });
  procs.push(p);
  return p;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kms-pgbouncer-test-'));
  const name = `${inject('runId')}_pgbouncer`;
  const url = new URL(inject('pgBase'));
  url.pathname = `/${name}`;
  directUrl = url.toString();
  await ensureDatabase(directUrl, inject('templateDb'));
  pgbouncer = await startPgBouncer(inject('pgBase'), POOL_SIZE);
  env = {
    NODE_ENV: 'test',
    LOG_LEVEL: 'info',
    DATABASE_URL: pgbouncer.urlOf(name),
    DATABASE_POOL_MODE: 'transaction',
    DATABASE_DIRECT_URL: directUrl,
    REDIS_URL: inject('redisUrl'),
    REDIS_PREFIX: name,
    BLOB_STORE_URL: join(dir, 'blobs'),
    MAIL_DIR: join(dir, 'mail'),
    ARGON2_MEMORY_KIB: '1024',
    LINEAGE_KDF_MEMORY_KIB: '1024',
    WORKER_QUEUES: 'crypto=2,rotation=2,notify=2,billing=1,team-sync=1,maintenance=1',
  };
  const ports = [await freePort(), await freePort()];
  const web = ports.map((port) => spawnRole('web', { PORT: String(port) }));
  const worker = spawnRole('worker');
  const scheduler = spawnRole('scheduler');
  await Promise.all([
    ...web.map((p) => waitForOutput(p, 'The service is ready', 60_000)),
    waitForOutput(worker, 'workers started', 60_000),
    waitForOutput(scheduler, 'scheduler started', 60_000),
  ]);
  for (const port of ports) {
    const base = `http://127.0.0.1:${port}/api/v1`;
    apis.push({ api: recorded(base), base });
  }
}, 120_000);

let failed = false;
afterEach(({ task }) => {
  failed ||= task.result?.state === 'fail' || Boolean(task.result?.errors?.length);
});

afterAll(async () => {
  if (failed)
    for (const p of procs)
      console.info(
        p
          .output()
          .split('\n')
          .filter((l) => /"level":(40|50|60)/.test(l))
          .slice(-20)
          .join('\n'),
      );
  for (const p of procs) p.kill('SIGKILL');
  await Promise.all(procs.map((p) => p.exited));
  await pgbouncer?.stop();
  if (directUrl) await dropDatabase(directUrl);
  await removeRedisKeys(inject('redisUrl'), `${inject('runId')}_pgbouncer`);
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

describe('the service behind PgBouncer 1.18 in transaction mode', () => {
  it('refuses to start in transaction mode without a direct connection for LISTEN', () => {
    expect(() => loadConfig({ ...env, DATABASE_DIRECT_URL: undefined })).toThrow(/DATABASE_POOL_MODE=transaction needs DATABASE_DIRECT_URL/);
  });

  it('serves accounts, keys, jobs, rotations, events and the audit relay through shared server connections, never a 500', async () => {
    const [a, b] = apis as [(typeof apis)[0], (typeof apis)[0]];
    const users = await Promise.all([registerUser(a.api), registerUser(b.api), registerUser(a.api)]);
    const sse = users.map((u, i) => openEvents(apis[i % 2].base, u.token));
    await Promise.all(sse.map((s) => s.opened));

    // Two keys per account, made at once through both processes.
    const keys = await Promise.all(users.flatMap((u, i) => [createKey(apis[i % 2].api, u.token), createKey(apis[(i + 1) % 2].api, u.token)]));
    const owner = (k: number) => users[Math.floor(k / 2)];

    // Sign-ins, reads and encryptions at once: many clients' statements on 3 server connections.
    const data = keys.map(() => randomBytes(4096 + Math.floor(Math.random() * 4096)));
    const [, , encs] = await Promise.all([
      Promise.all(users.flatMap((u) => [login(a.api, u), login(b.api, u)])),
      Promise.all(users.flatMap((u) => apis.map(({ api }) => api('GET', '/keys/list?page_size=100', { token: u.token })))),
      Promise.all(
        keys.map((k, i) =>
          apis[i % 2].api('POST', '/keys/encrypt', {
            token: owner(i).token,
            form: { fingerprint: k.fingerprint, files: [{ name: 'f.bin', data: data[i] }] },
            headers: { prefer: 'wait=30' },
          }),
        ),
      ),
    ]);
    for (const enc of encs) expect([200, 202], JSON.stringify(enc.body)).toContain(enc.status);
    const decs = await Promise.all(
      encs.map(async (enc, i) => {
        expect((await waitJob(b.api, owner(i).token, enc.body.job_id)).state).toBe('completed');
        const ciphertext = await download(a.api, owner(i).token, enc.body.job_id);
        return b.api('POST', '/keys/decrypt', {
          token: owner(i).token,
          form: { fingerprint: keys[i].fingerprint, passphrase: PASSPHRASE, files: [{ name: 'f.bin.gpg', data: ciphertext }] },
          headers: { prefer: 'wait=30' },
        });
      }),
    );
    await Promise.all(
      decs.map(async (dec, i) => {
        expect((await waitJob(a.api, owner(i).token, dec.body.job_id)).state).toBe('completed');
        expect(sha(await download(b.api, owner(i).token, dec.body.job_id))).toBe(sha(data[i]));
      }),
    );

    // Every key rotated once, all at once, then the first key once more: one generation per rotation.
    const rotate = (i: number, fingerprint: string) =>
      apis[i % 2].api('POST', `/keys/${fingerprint}/rotate`, { token: owner(i).token, body: {}, headers: { prefer: 'wait=30' } });
    const rots = await Promise.all(keys.map((k, i) => rotate(i, k.fingerprint)));
    for (const [i, rot] of rots.entries()) {
      expect([200, 202], JSON.stringify(rot.body)).toContain(rot.status);
      expect((await waitJob(a.api, owner(i).token, rot.body.job_id)).state).toBe('completed');
    }
    const generations = async (i: number) => {
      const list = await b.api('GET', '/keys/list?page_size=100', { token: owner(i).token });
      expect(list.status).toBe(200);
      return list.body.items.find((k: { lineage_id: string }) => k.lineage_id === keys[i].lineage_id) as { generation: number; fingerprint: string };
    };
    for (const i of keys.keys()) expect((await generations(i)).generation).toBe(2);
    const again = await rotate(0, (await generations(0)).fingerprint);
    expect((await waitJob(b.api, owner(0).token, again.body.job_id)).state).toBe('completed');
    expect((await generations(0)).generation).toBe(3);
    const history = await a.api('GET', '/keys/rotation-history?page_size=100', { token: owner(0).token });
    expect(history.body.items.filter((r: { lineage_id: string }) => r.lineage_id === keys[0].lineage_id).map((r: { status: string }) => r.status)).toEqual([
      'succeeded',
      'succeeded',
    ]);

    // Live events through both processes, and the audit relay's events (its LISTEN on the direct URL).
    for (const s of sse) {
      await expect.poll(() => s.events.filter((e) => e.type === 'keys.rotated').length, { timeout: 15_000 }).toBeGreaterThanOrEqual(2);
      await expect.poll(() => s.events.some((e) => e.type === 'audit_logs.recorded'), { timeout: 15_000 }).toBe(true);
      await s.close();
    }

    expect(statuses.filter((s) => s.status >= 500)).toEqual([]);
    for (const p of procs) expect(p.output()).not.toMatch(/prepared statement|unsupported startup parameter/);
  }, 180_000);
});
