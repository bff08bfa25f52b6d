import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import type { Config } from '../../config';
import { createContainer, type Container } from '../../container';
import { prepareDatabase } from '../../main';
import { createBlobStore, type BlobStore } from '../../blob';
import { rootsOf } from '../../root-of-trust/keyring';
import { forgetSignerMemory } from '../../audit/signer-memory';
import { ensureDatabase, openDatabase, type Db } from '../../../db/knex';
import { knownMigrations } from '../../../db/migrate';
import { bumpAllTokenVersions } from '../../../db/users';
import { recordAudit } from '../../../db/audit';
import { BackupError, type Manifest } from './archive';
import { openArchive } from './open-archive';
import { exitOf, psql, toolVersion } from './postgres-tools';

/**
 * How far a restore moves every account's token version: tokens issued before the restore never match
 * again (db/users.ts bumpAllTokenVersions), however many revocations the lost timeline made per account.
 */
const RESTORE_TOKEN_VERSION_STEP = 1 << 20;

export interface RestoreOptions {
  /** Replace a database that holds tables, and blobs already stored under the archive's keys. */
  force?: boolean;
}

export interface RestoreResult {
  manifest: Manifest;
  blobs: number;
}

const JOB_DIR = /^(jobs\/[0-9a-f-]{36}\/)/;

const publicTables = async (db: Db): Promise<number> =>
  Number((await db.raw<{ rows: { n: number }[] }>(`SELECT count(*) AS n FROM pg_tables WHERE schemaname = 'public'`)).rows[0].n);

/** The database back to empty: what a failed restore leaves (the target was empty, or `--force` gave it up). */
const emptyDatabase = (db: Db) => db.raw('DROP SCHEMA public CASCADE; CREATE SCHEMA public');

/**
 * Replays the dump through psql in ONE transaction whose COMMIT is written only after the dump's last
 * byte has been authenticated and matched its checksum: an archive cut or changed anywhere in the
 * dump, or a statement that fails, ends psql before it, and Postgres rolls everything back.
 */
async function replayDump(databaseUrl: string, body: AsyncIterable<Buffer>, force: boolean): Promise<void> {
  const child = psql(databaseUrl);
  const exit = exitOf(child, 'psql');
  async function* sql(): AsyncGenerator<Buffer> {
    yield Buffer.from(`BEGIN;\n${force ? 'DROP SCHEMA public CASCADE;\nCREATE SCHEMA public;\n' : ''}`);
    const gunzip = createGunzip();
    const fed = pipeline(Readable.from(body), gunzip);
    fed.catch(() => undefined);
    for await (const chunk of gunzip) yield chunk as Buffer;
    await fed;
    yield Buffer.from('\nCOMMIT;\n');
  }
  try {
    await pipeline(Readable.from(sql(), { objectMode: true }), child.stdin!);
  } catch (err) {
    child.kill('SIGKILL');
    const { code, stderr } = await exit.catch(() => ({ code: 1, stderr: '' }));
    // psql stopped at a failing statement (its stdin then breaks): its own words say why.
    if (code !== 0 && stderr && !(err instanceof BackupError)) throw new BackupError(`psql failed: ${stderr}`);
    throw err;
  }
  const { code, stderr } = await exit;
  if (code !== 0) throw new BackupError(`psql failed (exit ${code}): ${stderr}`);
}

/** Refuses a target holding anything the restore would replace, unless forced. */
async function checkTarget(db: Db, store: BlobStore, manifest: Manifest, databaseUrl: string, force: boolean): Promise<void> {
  if (force) return;
  const tables = await publicTables(db);
  const name = decodeURIComponent(new URL(databaseUrl).pathname.slice(1));
  if (tables > 0)
    throw new BackupError(`the database "${name}" is not empty (${tables} tables): restore into an empty database, or pass --force to replace it`);
  for (const part of manifest.parts)
    if (part.key && (await store.stat(part.key)))
      throw new BackupError(`the blob store already holds ${part.key}: restore into an empty blob store, or pass --force to overwrite`);
}

/**
 * Restores an archive into the configured database and blob store (docs/backup-and-restore.md):
 * 1. reads the whole archive once and checks it (root key, authentication, checksums, a migration level
 *    this version knows), and that the target is empty, before writing anything;
 * 2. replays the database in one transaction (replayDump), migrates it to this version's level, then
 *    writes the blobs through the service's blob stack (sealed again under each job's key);
 * 3. makes it a recovery: every session token issued before is refused (token versions moved on), the
 *    audit signer's memory of later checkpoints is dropped, and the restore is recorded on the system chain.
 * A failure after the database committed empties it again and deletes the blobs written, so the target
 * ends restored or empty, never in between. Jobs that were unfinished are left to the reconciler
 * (workers/jobs/reconcile-jobs.ts): their queue entries are not in the archive.
 */
export async function restoreBackup(config: Config, path: string, opts: RestoreOptions = {}): Promise<RestoreResult> {
  const force = Boolean(opts.force);
  const roots = rootsOf(config.masterKeys);
  try {
    await toolVersion('psql');
    const { manifest } = await openArchive(path, roots);
    const known = new Set(knownMigrations());
    const unknown = manifest.migrations.filter((m) => !known.has(m));
    if (unknown.length)
      throw new BackupError(
        `the archive is from a newer version of the service (migrations ${unknown.join(', ')} are unknown here): restore it with that version`,
      );
    await ensureDatabase(config.databaseUrl);
    const db = openDatabase(config, { max: 1 });
    const store = await createBlobStore(config.blob.url, { s3: config.blob.s3, spareBytes: config.blob.spareBytes, env: {} });
    let c: Container | undefined;
    let committed = false;
    const written = new Set<string>();
    let blobs = 0;
    try {
      await checkTarget(db, store, manifest, config.databaseUrl, force);
      await openArchive(path, roots, {
        expected: manifest,
        async visit(head, body) {
          if (head.part === 'database') {
            if (committed) throw new BackupError('the archive holds two databases');
            await replayDump(config.databaseUrl, body, force);
            committed = true;
            await prepareDatabase(config);
            c = await createContainer(config);
            return;
          }
          const dir = JOB_DIR.exec(head.key)?.[1];
          if (!c || !dir) throw new BackupError(`the archive holds blob ${head.key} ${c ? 'outside a job' : 'before its database'}`);
          written.add(dir);
          await c.blob.put(head.key, Readable.from(body));
          blobs++;
        },
      });
      if (!c) throw new BackupError('the archive holds no database');
      await recover(c, manifest, blobs);
      return { manifest, blobs };
    } catch (err) {
      if (!committed) throw err;
      for (const dir of written) await c?.blob.deletePrefix(dir).catch(() => undefined);
      await emptyDatabase(db);
      throw new BackupError(
        `the restore failed after the database was replayed, and was undone (the database emptied, the blobs written deleted): ${(err as Error).message}`,
      );
    } finally {
      await c?.close();
      await store.close();
      await db.destroy();
    }
  } finally {
    await roots.close();
  }
}

/** What makes a restored database a recovery rather than a copy (see restoreBackup, step 3). */
async function recover(c: Container, manifest: Manifest, blobs: number): Promise<void> {
  await c.db.transaction(async (trx) => {
    const accounts = await bumpAllTokenVersions(trx, RESTORE_TOKEN_VERSION_STEP);
    await recordAudit(trx, {
      user_id: null,
      action: 'backups.restore',
      status: 'success',
      target: manifest.backup_id,
      details: {
        via: 'admin-cli',
        backup_id: manifest.backup_id,
        backup_created_at: manifest.created_at,
        migration: manifest.migrations.at(-1) ?? null,
        audit_rows: manifest.counts.audit_logs ?? 0,
        blobs,
        sessions_revoked_for: accounts,
      },
    });
  });
  await forgetSignerMemory(c);
}
