/**
 * What a backup and a restore cost (docs/backup-and-restore.md, docs/performance.md "Backup and restore"):
 * a service in this process with ACCOUNTS accounts, KEYS keys, FILES encrypted files of FILE_BYTES and at
 * least AUDIT_ROWS audit rows; then, while it runs, the backup (lib/operations/backup/take-backup.ts),
 * its verification, and a restore into a second, empty database and blob folder, and how long until a
 * service started on the restored copy answers a sign-in. Times are wall clock; sizes are bytes on disk.
 * Needs Postgres on 127.0.0.1:5432 (trust) and Redis on 127.0.0.1:6379; everything it makes it removes.
 *
 *   npm run bench:backup -- [--audit-rows N] [--keys N] [--files N]     (default 10000 audit rows, 100 keys, 20 files)
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { loadConfig } from '../lib/config';
import { startService } from '../lib/main';
import { dropDatabase } from '../db/knex';
import { recordAudit } from '../db/audit';
import { deleteKeysMatching } from '../lib/redis';
import { rootsOf } from '../lib/root-of-trust/keyring';
import { takeBackup } from '../lib/operations/backup/take-backup';
import { openArchive } from '../lib/operations/backup/open-archive';
import { restoreBackup } from '../lib/operations/backup/restore-backup';
import { sampleEntry } from './lib/audit';
import { intOption } from './lib/util';

const args = process.argv.slice(2);
const opt = (name: string, def: number) => intOption(args, name, def);
const AUDIT_ROWS = opt('--audit-rows', 10_000);
const KEYS = opt('--keys', 100);
const ACCOUNTS = 10;
const FILES = opt('--files', 20);
const FILE_BYTES = 1 << 20;

const id = `kms_bench_backup_${randomBytes(3).toString('hex')}`;
const dir = await mkdtemp(join(tmpdir(), `${id}-`));
const pg = new URL(process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres');
const envOf = (name: string): Record<string, string> => {
  const url = new URL(pg);
  url.pathname = `/${id}_${name}`;
  return {
    NODE_ENV: 'test',
    PORT: '0',
    LOG_LEVEL: 'silent',
    DATABASE_URL: url.toString(),
    REDIS_URL: process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379',
    REDIS_PREFIX: `${id}_${name}`,
    BLOB_STORE_URL: join(dir, `${name}-blobs`),
    MAIL_DIR: join(dir, `${name}-mail`),
    ARGON2_MEMORY_KIB: '1024',
    LINEAGE_KDF_MEMORY_KIB: '1024',
    WORKER_QUEUES: 'crypto=2,rotation=1,notify=1,billing=1,team-sync=1,maintenance=1',
  };
};
const source = envOf('source');
const target = envOf('target');

async function call(base: string, method: string, path: string, token?: string, body?: unknown, form?: FormData) {
  const headers: Record<string, string> = { prefer: 'wait=30' };
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(base + path, { method, headers, body: form ?? (body === undefined ? undefined : JSON.stringify(body)) });
  const json = (await res.json()) as Record<string, unknown>;
  if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(json)}`);
  return json;
}

async function finished(base: string, token: string, jobId: string) {
  for (;;) {
    const job = await call(base, 'GET', `/jobs/${jobId}`, token);
    if (job.state === 'completed') return job;
    if (job.state === 'failed') throw new Error(`job ${jobId} failed: ${JSON.stringify(job.error)}`);
  }
}

const mib = (bytes: number) => `${(bytes / 1048576).toFixed(1)} MiB`;
const seconds = (ms: number) => `${(ms / 1000).toFixed(2)} s`;

try {
  const service = await startService(['web', 'worker'], loadConfig(source));
  const c = service.container;
  const base = `http://127.0.0.1:${service.port}/api/v1`;
  const t0 = performance.now();
  const accounts = await Promise.all(
    Array.from({ length: ACCOUNTS }, async (_, i) => {
      const n = `${id.slice(-6)}${i}`;
      const input = { username: `bench_${n}`, email: `bench_${n}@example.test`, password: 'correct horse battery', company_name: 'Bench' };
      const reg = await call(base, 'POST', '/partners/register', undefined, input);
      const { user, session } = reg as { user: { user_id: string }; session: { token: string } };
      return { ...input, id: user.user_id, token: session.token, fingerprints: [] as string[] };
    }),
  );
  await Promise.all(
    accounts.map(async (a, i) => {
      for (let k = i; k < KEYS; k += ACCOUNTS) {
        const form = new FormData();
        for (const [f, v] of Object.entries({
          label: `k${k}`,
          environment: 'production',
          name: 'Bench',
          email: 'bench@example.test',
          passphrase: 'correct horse battery staple',
        }))
          form.append(f, v);
        const made = await call(base, 'POST', '/keys/generate-key', a.token, undefined, form);
        a.fingerprints.push(made.fingerprint as string);
      }
    }),
  );
  await Promise.all(
    accounts.map(async (a, i) => {
      for (let f = i; f < FILES; f += ACCOUNTS) {
        const form = new FormData();
        form.append('fingerprint', a.fingerprints[0]);
        form.append('files', new Blob([randomBytes(FILE_BYTES)]), `f${f}.bin`);
        const job = await call(base, 'POST', '/keys/encrypt', a.token, undefined, form);
        await finished(base, a.token, job.job_id as string);
      }
    }),
  );
  const have = Number((await c.db('audit_logs').count<{ n: number }[]>('* as n'))[0].n);
  let next = have;
  await Promise.all(
    accounts.map(async (a) => {
      for (let i = next++; i < AUDIT_ROWS; i = next++) await recordAudit(c.db, sampleEntry(a.id, i));
    }),
  );
  const counts = Object.fromEntries(
    await Promise.all(
      ['audit_logs', 'pgp_keys', 'users', 'jobs'].map(async (t) => [t, Number((await c.db(t).count<{ n: number }[]>('* as n'))[0].n)] as const),
    ),
  );
  console.log(`filled in ${seconds(performance.now() - t0)}: ${JSON.stringify(counts)}`);
  const dbSize = Number((await c.db.raw<{ rows: { n: string }[] }>('SELECT pg_database_size(current_database()) AS n')).rows[0].n);

  const archive = join(dir, 'backup.kmsbak');
  const b0 = performance.now();
  const made = await takeBackup(c, archive);
  const backupMs = performance.now() - b0;
  await service.stop();

  const roots = rootsOf(loadConfig(target).masterKeys);
  const v0 = performance.now();
  await openArchive(archive, roots);
  const verifyMs = performance.now() - v0;
  await roots.close();

  const r0 = performance.now();
  const restored = await restoreBackup(loadConfig(target), archive);
  const restoreMs = performance.now() - r0;
  const s0 = performance.now();
  const again = await startService(['web'], loadConfig(target));
  await call(`http://127.0.0.1:${again.port}/api/v1`, 'POST', '/auth/login', undefined, { identifier: accounts[0].username, password: accounts[0].password });
  const startMs = performance.now() - s0;
  await again.stop();

  const dbPart = made.manifest.parts.find((p) => p.part === 'database')!;
  const blobBytes = made.manifest.parts.filter((p) => p.part === 'blob').reduce((n, p) => n + p.bytes, 0);
  console.log(
    JSON.stringify(
      {
        counts,
        database_size: mib(dbSize),
        archive: mib((await stat(archive)).size),
        archive_database_part: `${(dbPart.bytes / 1024).toFixed(0)} KiB`,
        archive_blobs: `${made.manifest.parts.length - 1} blobs, ${mib(blobBytes)}`,
        backup: seconds(backupMs),
        verify: seconds(verifyMs),
        restore: seconds(restoreMs),
        restored_blobs: restored.blobs,
        restored_service_first_sign_in: seconds(startMs),
      },
      null,
      2,
    ),
  );
} finally {
  for (const env of [source, target]) {
    await dropDatabase(env.DATABASE_URL).catch(() => undefined);
    const redis = new Redis(env.REDIS_URL);
    await deleteKeysMatching(redis, `${env.REDIS_PREFIX}*`);
    redis.disconnect();
  }
  await rm(dir, { recursive: true, force: true });
}
