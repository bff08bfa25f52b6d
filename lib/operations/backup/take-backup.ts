import { randomBytes, randomUUID } from 'node:crypto';
import { createWriteStream, readFileSync } from 'node:fs';
import { rename, rm } from 'node:fs/promises';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGzip } from 'node:zlib';
import type { Knex } from 'knex';
import type { Container } from '../../container';
import { BlobNotFoundError } from '../../blob/types';
import { sealStream } from '../../blob/sealed';
import type { KeyringRow } from '../../root-of-trust/keyring';
import { jobBlob } from '../../jobs/job-records';
import { ArchiveHeader, BackupError, FORMAT, MAGIC_LINE, type Manifest, partBytes, type PartSum, sealedName } from './archive';
import { exitOf, pgDump, toolVersion } from './postgres-tools';

const VERSION = (JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version: string }).version;

export interface BackupResult {
  path: string;
  bytes: number;
  manifest: Manifest;
}

/** What the snapshot says besides the dump itself, read in the dump's own transaction. */
interface SnapshotFacts {
  migrations: string[];
  counts: Record<string, number>;
  keyring: Pick<KeyringRow, 'kid' | 'root_id' | 'wrapped' | 'retired_at'>[];
  postgres: string;
  /** Blob keys the snapshot's rows point to: files of jobs neither purged nor expired. */
  blobs: string[];
}

async function factsOf(trx: Knex.Transaction, now: Date): Promise<SnapshotFacts> {
  const migrations = (await trx('knex_migrations').orderBy('id').select('name')).map((r: { name: string }) => r.name);
  const tables = (await trx.raw<{ rows: { tablename: string }[] }>(`SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename`)).rows;
  const counts: Record<string, number> = {};
  for (const { tablename } of tables) counts[tablename] = Number((await trx(tablename).count<{ n: number }[]>('* as n'))[0].n);
  const keyring = await trx<KeyringRow>('keyring').orderBy('created_at').select('kid', 'root_id', 'wrapped', 'retired_at');
  const postgres = (await trx.raw<{ rows: { server_version: string }[] }>('SHOW server_version')).rows[0].server_version;
  const files = await trx('jobs as j')
    .join('job_files as f', 'f.job_id', 'j.id')
    .whereNull('j.purged_at')
    .andWhere((q) => void q.whereNull('j.expires_at').orWhere('j.expires_at', '>', now))
    .orderBy(['j.created_at', 'j.id', 'f.role', 'f.n'])
    .select<{ id: string; kind: string; role: 'input' | 'output'; n: number }[]>('j.id', 'j.kind', 'f.role', 'f.n');
  const blobs: string[] = [];
  const seen = new Set<string>();
  for (const f of files) {
    if (!seen.has(f.id)) {
      seen.add(f.id);
      if (f.kind === 'encrypt') blobs.push(jobBlob.recipient(f.id));
    }
    blobs.push(f.role === 'input' ? jobBlob.input(f.id, f.n) : jobBlob.output(f.id, f.n));
    if (f.kind === 'verify' && f.role === 'input') blobs.push(jobBlob.signature(f.id, f.n));
  }
  return { migrations, counts, keyring, postgres, blobs };
}

/** pg_dump's SQL, gzip'd, as it comes; the dump's failure fails the stream. */
async function* dumpBody(databaseUrl: string, snapshot: string): AsyncGenerator<Buffer> {
  const child = pgDump(databaseUrl, snapshot);
  const exit = exitOf(child, 'pg_dump');
  const gz = createGzip();
  exit.catch((err: Error) => gz.destroy(err));
  child.stdout!.pipe(gz);
  try {
    for await (const chunk of gz) yield chunk as Buffer;
  } finally {
    if (child.exitCode === null) child.kill();
  }
  const { code, stderr } = await exit;
  if (code !== 0) throw new BackupError(`pg_dump failed (exit ${code}): ${stderr}`);
}

/**
 * Writes a backup archive (./archive.ts) of the service `c` serves to `out`, while the service runs: the
 * database as of one snapshot (pg_dump inside a repeatable-read transaction that also reads the counts
 * and the blob list, so all three agree), then the blobs that snapshot points to, read through the
 * service's own blob stack (opened with each job's key, sealed again in the archive), then the manifest.
 * The archive is written beside `out` and renamed into place once complete: a failed backup leaves no
 * file that looks like one.
 */
export async function takeBackup(c: Container, out: string): Promise<BackupResult> {
  const [pgDumpVersion, now] = [await toolVersion('pg_dump'), c.clock.now()];
  const backupId = randomUUID();
  const current = c.keyring.current();
  const trx = await c.db.transaction({ isolationLevel: 'repeatable read', readOnly: true });
  const tmp = `${out}.partial-${randomBytes(4).toString('hex')}`;
  let trxOpen = true;
  const endSnapshot = async () => {
    if (!trxOpen) return;
    trxOpen = false;
    await trx.rollback().catch(() => undefined);
  };
  try {
    // The snapshot must outlive pg_dump's use of it: no idle limit while this transaction waits on the dump.
    await trx.raw('SET LOCAL idle_in_transaction_session_timeout = 0');
    const snapshot = (await trx.raw<{ rows: { id: string }[] }>('SELECT pg_export_snapshot() AS id')).rows[0].id;
    const facts = await factsOf(trx, now);
    const row = facts.keyring.find((k) => k.kid === current.kid);
    if (!row?.wrapped) throw new BackupError(`the current data key ${current.kid} is not in the keyring table`);
    const header: ArchiveHeader = {
      format: FORMAT,
      backup_id: backupId,
      created_at: now.toISOString(),
      kid: row.kid,
      root_id: row.root_id,
      wrapped: row.wrapped,
    };
    const headerLine = JSON.stringify(header);
    const parts: PartSum[] = [];
    const gone: string[] = [];

    async function* plaintext(): AsyncGenerator<Buffer> {
      const db: PartSum = { part: 'database', bytes: 0, sha256: '' };
      yield* partBytes({ part: 'database', encoding: 'pg_dump-plain+gzip' }, dumpBody(c.config.databaseUrl, snapshot), db);
      parts.push(db);
      await endSnapshot();
      for (const key of facts.blobs) {
        const body = await c.blob.get(key).catch((err: unknown) => {
          if (err instanceof BlobNotFoundError) return null;
          throw err;
        });
        // A recipient key or signature a job never had, or a file purged since the snapshot.
        if (!body) {
          if (!/\/(recipient\.asc|sig\/\d+)$/.test(key)) gone.push(key);
          continue;
        }
        const sum: PartSum = { part: 'blob', key, bytes: 0, sha256: '' };
        yield* partBytes({ part: 'blob', key }, body, sum);
        parts.push(sum);
      }
      const manifest: Manifest = {
        format: FORMAT,
        backup_id: backupId,
        created_at: header.created_at,
        versions: { service: VERSION, postgres: facts.postgres, pg_dump: pgDumpVersion, node: process.version },
        migrations: facts.migrations,
        keyring: facts.keyring.map((k) => ({ kid: k.kid, root_id: k.root_id, retired: Boolean(k.retired_at || !k.wrapped), current: k.kid === current.kid })),
        counts: facts.counts,
        blobs_gone: gone,
        parts,
      };
      result = manifest;
      yield* partBytes({ part: 'manifest' }, [Buffer.from(JSON.stringify(manifest))], { part: 'blob', bytes: 0, sha256: '' });
    }

    let result: Manifest | undefined;
    let bytes = 0;
    async function* file(): AsyncGenerator<Buffer> {
      const head = Buffer.from(`${MAGIC_LINE}\n${headerLine}\n`);
      bytes += head.length;
      yield head;
      for await (const chunk of sealStream(plaintext(), current.key, sealedName(headerLine))) {
        bytes += chunk.length;
        yield chunk;
      }
    }
    await pipeline(Readable.from(file(), { objectMode: true, highWaterMark: 4 }), createWriteStream(tmp, { flags: 'wx', mode: 0o600 }));
    await rename(tmp, out);
    return { path: out, bytes, manifest: result! };
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  } finally {
    await endSnapshot();
  }
}
