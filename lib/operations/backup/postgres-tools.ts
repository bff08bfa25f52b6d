import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { promisify } from 'node:util';
import { BackupError } from './archive';

/**
 * The machine's Postgres client tools (pg_dump, psql from PATH): pg_dump is the one program that knows
 * how to write every object of a database (tables, sequences, triggers, functions) from one consistent
 * snapshot, and psql replays it. The password goes in the environment, never in the arguments (`ps` shows those).
 */
function connectionOf(databaseUrl: string): { dbname: string; env: NodeJS.ProcessEnv } {
  const url = new URL(databaseUrl);
  const password = decodeURIComponent(url.password);
  url.password = '';
  return { dbname: url.toString(), env: { ...process.env, ...(password ? { PGPASSWORD: password } : {}) } };
}

export async function toolVersion(tool: 'pg_dump' | 'psql'): Promise<string> {
  try {
    const { stdout } = await promisify(execFile)(tool, ['--version']);
    return stdout.trim();
  } catch (err) {
    throw new BackupError(`${tool} is needed (Postgres client tools on PATH): ${(err as Error).message}`);
  }
}

/** A child's exit, with the end of what it said on stderr; a spawn failure (no such program) rejects. */
export function exitOf(child: ChildProcess, tool: string): Promise<{ code: number; stderr: string }> {
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => (stderr = (stderr + d.toString('utf8')).slice(-4000)));
  return new Promise((resolve, reject) => {
    child.once('error', (err) => reject(new BackupError(`${tool} could not run: ${err.message}`)));
    child.once('close', (code) => resolve({ code: code ?? 1, stderr: stderr.trim() }));
  });
}

/** pg_dump of the database as of `snapshot` (pg_export_snapshot), plain SQL without owners or grants. */
export function pgDump(databaseUrl: string, snapshot: string): ChildProcess {
  const { dbname, env } = connectionOf(databaseUrl);
  return spawn('pg_dump', [`--dbname=${dbname}`, `--snapshot=${snapshot}`, '--format=plain', '--no-owner', '--no-privileges'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env,
  });
}

/** psql reading SQL on stdin, stopping at the first error. */
export function psql(databaseUrl: string): ChildProcess {
  const { dbname, env } = connectionOf(databaseUrl);
  return spawn('psql', [`--dbname=${dbname}`, '--no-psqlrc', '--quiet', '--set=ON_ERROR_STOP=1', '--output=/dev/null'], {
    stdio: ['pipe', 'ignore', 'pipe'],
    env,
  });
}
