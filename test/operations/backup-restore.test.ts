import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { Redis } from 'ioredis';
import type { Redis as ServiceRedis } from '../../lib/redis';
import { inject } from 'vitest';
import { apiClient, login, registerUser, removeRedisKeys, startTestService, type ApiClient, type TestService } from '../support/service';
import { admin, startSoftHsm, type SoftHsm } from '../support/softhsm';
import { startS3 } from '../support/s3';
import { createKey, download, encrypt, PASSPHRASE, runJob, waitJob } from '../support/keys';
import { loadConfig } from '../../lib/config';
import { startService, type Service } from '../../lib/main';
import { createDb, dropDatabase } from '../../db/knex';
import { LocalBlobStore } from '../../lib/blob';
import { checkpointChains, verifyChain } from '../../lib/audit/audit-evidence';

/**
 * The restore drill: a service with accounts, keys of two generations, a rotation schedule, encrypted
 * files, an audit trail and a job in flight is backed up while it runs; then its database, blob folder
 * and Redis state are all lost; the archive is restored onto empty ones with the operator command and a
 * service started on them. Once with MASTER_KEY as the root key, once with the root key in SoftHSM2; the
 * first also feeds the command the archives it must refuse.
 */
let hsm: SoftHsm;
let work: string;

beforeAll(async () => {
  hsm = await startSoftHsm();
  work = await mkdtemp(join(tmpdir(), 'kms-backup-'));
});

afterAll(async () => {
  await hsm?.stop();
  await rm(work, { recursive: true, force: true });
});

/** What the drill puts into the service before the backup, and checks after the restore. */
async function fill(s: TestService) {
  const u = await registerUser(s.api);
  const key = await createKey(s.api, u.token);
  const enc = await encrypt(s.api, u.token, key.fingerprint, [{ name: 'a.txt', data: Buffer.from('encrypted before the backup') }]);
  const rotated = await s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=30' } });
  expect(rotated.status, JSON.stringify(rotated.body)).toBeLessThan(300);
  expect((await waitJob(s.api, u.token, rotated.body.job_id)).state).toBe('completed');
  const schedule = await s.api('POST', `/keys/${key.fingerprint}/rotation-schedule`, { token: u.token, body: { rotation_interval_days: 30 } });
  expect(schedule.status, JSON.stringify(schedule.body)).toBe(200);
  // A job a worker had taken when the backup was made: its queue entry is not in the archive.
  const inFlight = randomUUID();
  await s.c.db('jobs').insert({ id: inFlight, user_id: u.id, kind: 'decrypt', state: 'active', created_at: new Date(Date.now() - 3600_000) });
  expect((await verifyChain(s.c, u.id)).ok).toBe(true);
  return { u, key, enc, inFlight, generations: (await generations(s.api, u.token, key.fingerprint)).length };
}

async function generations(api: ApiClient, token: string, fingerprint: string) {
  const res = await api('GET', `/keys/${fingerprint}/generations`, { token });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.items as { fingerprint: string }[];
}

/** Tables of a database; null when it does not exist. */
async function tablesOf(databaseUrl: string): Promise<number | null> {
  const url = new URL(databaseUrl);
  const name = url.pathname.slice(1);
  url.pathname = '/postgres';
  const server = createDb(url.toString(), { max: 1 });
  try {
    if (!(await server.raw('SELECT 1 FROM pg_database WHERE datname = ?', [name])).rows.length) return null;
  } finally {
    await server.destroy();
  }
  const db = createDb(databaseUrl, { max: 1 });
  try {
    return Number((await db.raw(`SELECT count(*) AS n FROM pg_tables WHERE schemaname = 'public'`)).rows[0].n);
  } finally {
    await db.destroy();
  }
}

/** The values of the keys matching `pattern`. */
async function kept(redis: ServiceRedis, pattern: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const key of await redis.keys(pattern)) out[key] = (await redis.get(key))!;
  return out;
}

/** Another database and blob folder of this run, for restores that must be refused. */
function scratchTarget(env: Record<string, string>, name: string) {
  const url = new URL(env.DATABASE_URL);
  url.pathname = `/${inject('runId')}_${name}_${randomBytes(2).toString('hex')}`;
  return { ...env, DATABASE_URL: url.toString(), BLOB_STORE_URL: join(work, `${name}-blobs`) };
}

async function drill(env: Record<string, string>, { badInputs = false, restoreInto = {} }: { badInputs?: boolean; restoreInto?: Record<string, string> } = {}) {
  const s = await startTestService({ env });
  let restored: Service | undefined;
  try {
    const before = await fill(s);
    const archive = join(work, `${randomBytes(3).toString('hex')}.kmsbak`);
    // Taken while the service works: sign-ins write the account's audit chain all along.
    let backingUp = true;
    const traffic = (async () => {
      while (backingUp) await login(s.api, before.u);
    })();
    const made = await admin(['backup', '--out', archive], s.env).finally(() => (backingUp = false));
    await traffic;
    expect(made, made.err).toMatchObject({ code: 0, out: expect.stringMatching(/^Wrote .* \d+ blobs/m) });
    const verified = await admin(['backup', 'verify', archive], s.env);
    expect(verified, verified.err).toMatchObject({ code: 0, out: expect.stringMatching(/^OK: .*opens with the root key/m) });
    // The archive carries no secret in the clear: the file's own plaintext is not in it.
    expect((await readFile(archive)).includes('encrypted before the backup')).toBe(false);

    if (badInputs) await refusals(s, archive);

    // After the backup the service goes on: the account's chain grows and its head is signed.
    await login(s.api, before.u);
    expect((await checkpointChains(s.c)).signed).toBeGreaterThan(0);
    const signerMemory = await kept(s.c.redis, `${s.env.REDIS_PREFIX}:audit:signed:*`);
    expect(Object.keys(signerMemory).length).toBeGreaterThan(0);

    // The disaster: database and blob folder gone; Redis too, but for the signer's memory of those later
    // checkpoints (as when only Postgres is lost), which the restore must let go of.
    await s.stop();
    expect(await stat(s.env.BLOB_STORE_URL).catch(() => null)).toBe(null);
    const redis = new Redis(s.env.REDIS_URL);
    for (const [k, v] of Object.entries(signerMemory)) await redis.set(k, v);
    redis.disconnect();
    const target = { ...s.env, ...restoreInto };
    const back = await admin(['restore', archive], target);
    expect(back, back.err).toMatchObject({ code: 0, out: expect.stringMatching(/^Restored .*\(\d+ blobs written\)/m) });

    restored = await startService(['web', 'worker', 'scheduler'], loadConfig(target));
    const c = restored.container;
    const api = apiClient(`http://127.0.0.1:${restored.port}/api/v1`);
    // A restore is a recovery: the old session is refused, the same password signs in.
    expect((await api('GET', '/keys/list', { token: before.u.token })).status).toBe(401);
    const token = await login(api, before.u);
    // Every key and generation is there, and the file encrypted before the backup decrypts.
    expect((await generations(api, token, before.key.fingerprint)).length).toBe(before.generations);
    const sealedFile = await download(api, token, before.enc.job_id);
    const dec = await runJob(api, token, '/keys/decrypt', {
      fingerprint: before.key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'a.txt.gpg', data: sealedFile }],
    });
    expect(dec.state, JSON.stringify(dec.error)).toBe('completed');
    expect((await download(api, token, dec.job_id)).toString()).toBe('encrypted before the backup');
    // The audit chains verify and go on; the restore itself is on the system chain; checkpoints sign again.
    const chain = await verifyChain(c, before.u.id);
    expect(chain, JSON.stringify(chain.first_break)).toMatchObject({ ok: true });
    const system = await verifyChain(c, 'system');
    expect(system, JSON.stringify(system.first_break)).toMatchObject({ ok: true });
    expect(await c.db('audit_logs').where({ action: 'backups.restore', chain: 'system' }).count('* as n')).toEqual([{ n: 1 }]);
    expect((await checkpointChains(c)).broken).toBe(0);
    // The schedules are registered again, the key's rotation schedule with them.
    expect(await c.jobs.queue('rotation').getJobScheduler('rotation-sweep')).toBeTruthy();
    const lineage = await c.db('key_lineages').where({ id: before.key.lineage_id }).first();
    expect(lineage).toMatchObject({ rotation_mode: 'interval', rotation_interval_days: 30 });
    // The job in flight: the reconciler finds its queue entry gone and fails it with a clear code.
    await c.jobs.enqueue('reconcile-jobs', {});
    await expect.poll(async () => (await c.db('jobs').where({ id: before.inFlight }).first()).error?.code, { timeout: 15_000 }).toBe('job_lost');

    if (badInputs) {
      // With --force a restore replaces a database that holds tables, in the same one transaction.
      await restored.stop();
      restored = undefined;
      const again = await admin(['restore', archive, '--force'], target);
      expect(again, again.err).toMatchObject({ code: 0 });
      const db = createDb(target.DATABASE_URL, { max: 1 });
      try {
        expect(await db('jobs').where({ id: before.inFlight }).first()).toMatchObject({ state: 'active' });
        expect(await db('audit_logs').where({ action: 'backups.restore' }).count('* as n')).toEqual([{ n: 1 }]);
      } finally {
        await db.destroy();
      }
    }
  } finally {
    await restored?.stop();
    await s.stop().catch(() => undefined);
    await dropDatabase(s.env.DATABASE_URL).catch(() => undefined);
    await removeRedisKeys(s.env.REDIS_URL, s.env.REDIS_PREFIX);
    await rm(dirname(s.env.BLOB_STORE_URL), { recursive: true, force: true });
  }
}

/** Archives and targets the commands must refuse, each with a clear message and nothing written. */
async function refusals(s: TestService, archive: string) {
  const bytes = await readFile(archive);
  const cut = join(work, 'cut.kmsbak');
  await writeFile(cut, bytes.subarray(0, Math.floor(bytes.length * 0.7)));
  const altered = join(work, 'altered.kmsbak');
  const changed = Buffer.from(bytes);
  changed[Math.floor(bytes.length / 2)] ^= 0x01;
  await writeFile(altered, changed);
  const endCut = join(work, 'end-cut.kmsbak');
  await writeFile(endCut, bytes.subarray(0, bytes.length - 1));

  const verify = (file: string, env = s.env) => admin(['backup', 'verify', file], env);
  expect(await verify(cut)).toMatchObject({ code: 1, err: expect.stringMatching(/truncated/) });
  expect(await verify(endCut)).toMatchObject({ code: 1, err: expect.stringMatching(/altered or truncated/) });
  expect(await verify(altered)).toMatchObject({ code: 1, err: expect.stringMatching(/altered or truncated: chunk \d+ failed authentication/) });
  const notArchive = join(work, 'not.kmsbak');
  await writeFile(notArchive, 'hello\n');
  expect(await verify(notArchive)).toMatchObject({ code: 1, err: expect.stringMatching(/not a backup archive/) });
  const otherRoot = { ...s.env, MASTER_KEY: `k1:${randomBytes(32).toString('base64')}` };
  expect(await verify(archive, otherRoot)).toMatchObject({ code: 1, err: expect.stringMatching(/does not open with the root key configured here/) });

  // A database that holds tables (the running service's own) is refused, and left as it was.
  const users = await s.c.db('users').count('* as n');
  const into = await admin(['restore', archive], s.env);
  expect(into).toMatchObject({ code: 1, err: expect.stringMatching(/is not empty \(\d+ tables\).*--force/) });
  expect(await s.c.db('users').count('* as n')).toEqual(users);
  // So is a blob store that holds the archive's blobs.
  const blobsTaken = { ...scratchTarget(s.env, 'blobs_taken'), BLOB_STORE_URL: s.env.BLOB_STORE_URL };
  expect(await admin(['restore', archive], blobsTaken)).toMatchObject({ code: 1, err: expect.stringMatching(/blob store already holds jobs\//) });
  expect(await tablesOf(blobsTaken.DATABASE_URL)).toBe(0);
  await dropDatabase(blobsTaken.DATABASE_URL);
  // Bad archives and the wrong root key leave an empty target empty.
  for (const [file, env] of [
    [altered, s.env],
    [cut, s.env],
    [archive, otherRoot],
  ] as const) {
    const target = scratchTarget(env, 'refused');
    const res = await admin(['restore', file], target);
    expect(res.code, res.err).toBe(1);
    expect([null, 0]).toContain(await tablesOf(target.DATABASE_URL));
    expect(await stat(join(target.BLOB_STORE_URL, 'jobs')).catch(() => null)).toBe(null);
    await dropDatabase(target.DATABASE_URL).catch(() => undefined);
  }
  // An archive of a database migrated further than this version knows is refused before anything is written.
  const future = join(work, 'future.kmsbak');
  await s.c.db('knex_migrations').insert({ name: '999_from_a_later_version', batch: 99, migration_time: new Date() });
  try {
    expect(await admin(['backup', '--out', future], s.env)).toMatchObject({ code: 0 });
  } finally {
    await s.c.db('knex_migrations').where({ name: '999_from_a_later_version' }).delete();
  }
  const later = scratchTarget(s.env, 'later');
  expect(await admin(['restore', future], later)).toMatchObject({ code: 1, err: expect.stringMatching(/newer version .*999_from_a_later_version/) });
  expect(await tablesOf(later.DATABASE_URL)).toBe(null);

  // A failure after the database committed (a blob store that takes no new folder) empties it again.
  const late = scratchTarget(s.env, 'late');
  new LocalBlobStore(late.BLOB_STORE_URL);
  execFileSync('chattr', ['+i', late.BLOB_STORE_URL]);
  try {
    const res = await admin(['restore', archive], late);
    expect(res).toMatchObject({ code: 1, err: expect.stringMatching(/failed after the database was replayed, and was undone.*EPERM/) });
    expect(await tablesOf(late.DATABASE_URL)).toBe(0);
  } finally {
    execFileSync('chattr', ['-i', late.BLOB_STORE_URL]);
    await dropDatabase(late.DATABASE_URL).catch(() => undefined);
  }
}

describe('backup and restore', () => {
  it('restores everything with MASTER_KEY as the root; refuses bad archives, the wrong root key and non-empty targets', { timeout: 120_000 }, async () => {
    await drill({}, { badInputs: true });
  });

  it('restores everything with the root key in a PKCS#11 token (SoftHSM2), into an S3 store', { timeout: 90_000 }, async () => {
    const uri = hsm.uri('backup-root');
    const made = await admin(['master-key', 'init'], { NODE_ENV: 'test', MASTER_KEY_URI: uri });
    expect(made, made.err).toMatchObject({ code: 0 });
    // Restored into S3 (s3rver) from a folder store: job files go through the blob stack both ways.
    const s3 = await startS3(await mkdtemp(join(work, 's3-')));
    try {
      await drill({ MASTER_KEY_URI: uri }, { restoreInto: s3.env });
    } finally {
      await s3.close();
    }
  });
});
