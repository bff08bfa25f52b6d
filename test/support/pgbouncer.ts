import { spawn } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './ports';

/**
 * A private PgBouncer (Debian's, scripts/test-peers.sh) in transaction mode in front of the Postgres of
 * `upstream`, on a free loopback port, with its configuration in a temporary folder. `poolSize` server
 * connections per database are shared by every client: consecutive transactions of one client run on
 * whichever is free. It trusts every client (`auth_type = any`) and logs in as the upstream's user.
 */
export async function startPgBouncer(
  upstream: string,
  poolSize: number,
): Promise<{ port: number; urlOf: (database: string) => string; stop: () => Promise<void> }> {
  const up = new URL(upstream);
  const dir = await mkdtemp(join(tmpdir(), 'kms-pgbouncer-'));
  const port = await freePort();
  const ini = [
    '[databases]',
    `* = host=${up.hostname} port=${up.port || 5432} user=${decodeURIComponent(up.username || 'postgres')}`,
    '[pgbouncer]',
    'listen_addr = 127.0.0.1',
    `listen_port = ${port}`,
    'unix_socket_dir =',
    'auth_type = any',
    'pool_mode = transaction',
    `default_pool_size = ${poolSize}`,
    'max_client_conn = 500',
    // What DB_IDLE_IN_TRANSACTION_SECONDS is directly on Postgres (docs/scale-out.md).
    'idle_transaction_timeout = 60',
    // PgBouncer refuses to run as root; started as root it changes to this user.
    ...(process.getuid?.() === 0 ? ['user = postgres'] : []),
  ].join('\n');
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'pgbouncer.ini'), `${ini}\n`, { mode: 0o644 });
  const child = spawn('/usr/sbin/pgbouncer', [join(dir, 'pgbouncer.ini')], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr.on('data', (c: Buffer) => (output += c.toString()));
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  const stop = async () => {
    child.kill('SIGKILL');
    await exited;
    await rm(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 10_000;
  while (!output.includes('process up')) {
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop();
      throw new Error(`pgbouncer did not start:\n${output}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const urlOf = (database: string) => {
    const url = new URL(upstream);
    url.host = `127.0.0.1:${port}`;
    url.pathname = `/${database}`;
    return url.toString();
  };
  return { port, urlOf, stop };
}
