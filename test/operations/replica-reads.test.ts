import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { createDb, type Db } from '../../db/knex';
import { migrateLatest } from '../../db/migrate';
import { loadConfig } from '../../lib/config';
import { createContainer } from '../../lib/container';
import { startService } from '../../lib/main';
import type { Redis as ServiceRedis } from '../../lib/redis';
import { ReplicaReads } from '../../lib/replica-reads';
import { apiClient, registerUser, removeRedisKeys, type ApiClient } from '../support/service';
import { createKey } from '../support/keys';
import { captureLogs } from '../support/logs';
import type { Logger } from '../../lib/logger';
import { startPostgresPair } from '../support/postgres-pair';

/**
 * Reads that leave the primary (DATABASE_REPLICA_URL) on a real asynchronous standby whose replay the
 * test pauses: what each caller sees shows which server answered, since a row that the paused standby
 * has not replayed exists only on the primary. One account, two callers: its session writes, its partner
 * key only reads.
 */
const MAX_LAG_SECONDS = 5;

let pair: Awaited<ReturnType<typeof startPostgresPair>> | undefined;
let dir: string;
let prefix: string;
let service: Awaited<ReturnType<typeof startService>> | undefined;
let api: ApiClient;
let base: string;
let primary: pg.Client;
let standby: pg.Client;
const logs = captureLogs();

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kms-replica-'));
  pair = await startPostgresPair({ synchronous: false });
  primary = new pg.Client({ connectionString: pair.url(pair.primaryPort) });
  await primary.connect();
  await primary.query('CREATE DATABASE kms');
  const migrator = createDb(pair.url(pair.primaryPort, 'kms'), { max: 1 });
  await migrateLatest(migrator);
  await migrator.destroy();
  standby = new pg.Client({ connectionString: pair.url(pair.standbyPort) });
  standby.on('error', () => undefined); // the test stops the standby under it
  await standby.connect();
  prefix = `${inject('runId')}_replica`;
  ({ service, base, api } = await startOn(pair.url(pair.standbyPort, 'kms'), prefix, logs.logger('info')));
}, 120_000);

/** The service in this process on the pair's primary, with `replicaUrl` as its replica. */
async function startOn(replicaUrl: string, redisPrefix: string, log: Logger) {
  const config = loadConfig({
    NODE_ENV: 'test',
    PORT: '0',
    DATABASE_URL: pair!.url(pair!.primaryPort, 'kms'),
    DATABASE_REPLICA_URL: replicaUrl,
    DATABASE_REPLICA_MAX_LAG_SECONDS: String(MAX_LAG_SECONDS),
    REDIS_URL: inject('redisUrl'),
    REDIS_PREFIX: redisPrefix,
    BLOB_STORE_URL: join(dir, 'blobs'),
    MAIL_DIR: join(dir, 'mail'),
    ARGON2_MEMORY_KIB: '1024',
    LINEAGE_KDF_MEMORY_KIB: '1024',
  });
  const started = await startService(['web', 'worker'], config, await createContainer(config, { log }));
  const url = `http://127.0.0.1:${started.port}/api/v1`;
  return { service: started, base: url, api: apiClient(url) };
}

afterAll(async () => {
  await service?.stop();
  await primary?.end();
  await standby?.end().catch(() => undefined);
  await pair?.stop();
  if (prefix) await removeRedisKeys(inject('redisUrl'), prefix);
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

/** A commit on the primary, replayed by the standby before this returns: its lag starts from about 0. */
async function caughtUp(): Promise<void> {
  await primary.query('SELECT txid_current()'); // an xid, so a commit record with its time
  const { rows } = await primary.query<{ lsn: string }>('SELECT pg_current_wal_lsn() AS lsn');
  await expect
    .poll(async () => (await standby.query<{ ok: boolean }>('SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn AS ok', [rows[0].lsn])).rows[0].ok, {
      timeout: 10_000,
      interval: 20,
    })
    .toBe(true);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const fingerprints = async (token: string): Promise<string[]> => {
  const res = await api('GET', '/keys/list?page_size=100', { token });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return (res.body.items as { fingerprint: string }[]).map((k) => k.fingerprint);
};

const verdict = async (token: string) => {
  const res = await api('GET', '/audit-logs/verify', { token });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body as { ok: boolean; rows: number };
};

const exportedRows = async (token: string): Promise<number> => {
  const res = await fetch(`${base}/audit-logs/export`, { headers: { authorization: `Bearer ${token}` } });
  expect(res.status).toBe(200);
  return (await res.text()).split('\n').filter((l) => l && (JSON.parse(l) as { type: string }).type === 'row').length;
};

describe('a replica whose queries fail', () => {
  it('answers from the primary: a read handed the replica runs again there, once', async () => {
    // The standby's `postgres` database: its replay position reads as the service's own, but it has no tables.
    const debug = captureLogs();
    const broken = await startOn(pair!.url(pair!.standbyPort, 'postgres'), `${prefix}_broken`, debug.logger('debug'));
    try {
      const u = await registerUser(broken.api);
      await caughtUp();
      for (let i = 0; i < 3; i++) {
        const res = await broken.api('GET', '/keys/list', { token: u.apiKey });
        expect(res.status, JSON.stringify(res.body)).toBe(200);
      }
      // The first read failed on the replica and ran again on the primary; the replica then counts as
      // failing, so the next reads go to the primary at once.
      expect(debug.output().split('a read on the database replica failed; it runs again on the primary')).toHaveLength(2);
      expect(debug.output().split('the database replica fails')).toHaveLength(2);
    } finally {
      await broken.service.stop();
    }
  });
});

describe('reads that tolerate lag, on a streaming replica', () => {
  it("go to the replica unless the caller's own write or the lag bound needs the primary, and to the primary when the replica is gone", async () => {
    const u = await registerUser(api);
    const reader = u.apiKey; // the partner key: the same account, a caller that writes nothing here
    await caughtUp();
    const before = await verdict(reader);

    await standby.query('SELECT pg_wal_replay_pause()');
    await expect.poll(async () => (await standby.query<{ s: string }>('SELECT pg_get_wal_replay_pause_state() AS s')).rows[0].s).toBe('paused');
    const pausedAt = Date.now();

    // The session writes: its own reads see the write (the primary), the partner key's do not (the replica).
    const key = await createKey(api, u.token);
    expect(await fingerprints(u.token)).toContain(key.fingerprint);
    expect(await fingerprints(reader)).not.toContain(key.fingerprint);
    // The audit chain too: the key's creation is a row the replica has not replayed.
    const own = await verdict(u.token);
    const replica = await verdict(reader);
    expect(own.ok && replica.ok).toBe(true);
    expect(own.rows).toBeGreaterThan(replica.rows);
    expect(replica.rows).toBe(before.rows);
    expect(await exportedRows(reader)).toBe(replica.rows);
    expect(await exportedRows(u.token)).toBe(own.rows);
    expect(Date.now() - pausedAt, 'the replica phase must end within the lag bound').toBeLessThan(MAX_LAG_SECONDS * 1000);

    // Past the lag bound every read goes to the primary.
    await sleep(MAX_LAG_SECONDS * 1000 + 300 - (Date.now() - pausedAt));
    expect(await fingerprints(reader)).toContain(key.fingerprint);
    expect((await verdict(reader)).rows).toBe(own.rows);

    await standby.query('SELECT pg_wal_replay_resume()');
    await caughtUp();
    await sleep(300); // the service's reading of the replica from before the resume is out of date by now
    expect(await fingerprints(reader)).toContain(key.fingerprint);

    // The replica gone (while a reading of it is fresh, and after): every read answers 200 from the
    // primary, and its failure is logged once.
    await pair!.stopStandby();
    const second = await createKey(api, u.token, { label: 'second' });
    for (let i = 0; i < 8; i++) {
      expect(await fingerprints(reader)).toEqual(expect.arrayContaining([key.fingerprint, second.fingerprint]));
      await sleep(150);
    }
    expect((await verdict(reader)).ok).toBe(true);
    const replicaLogs = logs
      .output()
      .split('\n')
      .filter((l) => l.includes('"msg":') && /replica/.test(l.slice(l.indexOf('"msg":'))));
    expect(
      replicaLogs.filter((l) => l.includes('the database replica fails')),
      replicaLogs.join('\n'),
    ).toHaveLength(1);
  }, 60_000);
});

describe('without DATABASE_REPLICA_URL', () => {
  it('reads the primary and records nothing: no statement, no Redis command', async () => {
    const db: Db = createDb(pair!.url(pair!.primaryPort, 'kms'), { max: 1 });
    let statements = 0;
    db.on('query', () => statements++);
    const redis = new Proxy({} as ServiceRedis, {
      get: () => {
        throw new Error('Redis used');
      },
    });
    const reads = new ReplicaReads({ primary: db, replica: undefined, redis, redisPrefix: prefix, maxLagMs: 0, log: logs.logger('info') });
    try {
      expect(await reads.readDb('session:x:1')).toBe(db);
      await reads.wrote('session:x:1');
      expect(reads.configured).toBe(false);
      expect(statements).toBe(0);
    } finally {
      await db.destroy();
    }
  });
});
