import { execFile } from 'node:child_process';
import { appendFile, chown, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { freePort } from './ports';

const run = promisify(execFile);
const BIN = '/usr/lib/postgresql/15/bin';

/** Postgres refuses to run as root: as root, its commands run as the `postgres` user (and it owns `dir`). */
const asOwner = (cmd: string, args: string[]) =>
  process.getuid?.() === 0 ? run('runuser', ['-u', 'postgres', '--', join(BIN, cmd), ...args]) : run(join(BIN, cmd), args);

async function waitReady(port: number, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ok = await asOwner('pg_isready', ['-h', '127.0.0.1', '-p', String(port), '-q']).then(
      () => true,
      () => false,
    );
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`Postgres on ${port} not ready within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The ids of a process's children (a postmaster's backends), from /proc. */
async function childrenOf(pid: number): Promise<number[]> {
  const { stdout } = await run('ps', ['-o', 'pid=', '--ppid', String(pid)]).catch(() => ({ stdout: '' }));
  return stdout
    .split('\n')
    .map((l) => Number(l.trim()))
    .filter((n) => n > 0);
}

/** SIGKILL to a process and its children at once (a machine gone), ignoring those already gone. */
async function killTree(pid: number): Promise<void> {
  for (const p of [pid, ...(await childrenOf(pid))]) {
    try {
      process.kill(p, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

/**
 * A private Postgres 15 primary and a synchronous streaming standby (`pg_basebackup -R`,
 * `synchronous_standby_names`, `synchronous_commit=on`) on free loopback ports: a commit
 * the primary acknowledges is on the standby too. `killPrimary` is a machine's loss (SIGKILL of the
 * postmaster and its backends); `promote` makes the standby the primary. `stop` removes both, and their
 * folder (a temporary one of their own: as root, the `postgres` user owns it).
 * `synchronous: false`: the standby is an asynchronous read replica, whose loss (`stopStandby`) holds no commit.
 */
export async function startPostgresPair(opts: { synchronous?: boolean } = {}) {
  const synchronous = opts.synchronous ?? true;
  const dir = await mkdtemp(join(tmpdir(), 'kms-pg-pair-'));
  if (process.getuid?.() === 0) await chown(dir, Number((await run('id', ['-u', 'postgres'])).stdout), Number((await run('id', ['-g', 'postgres'])).stdout));
  const [primaryPort, standbyPort] = [await freePort(), await freePort()];
  const primary = join(dir, 'primary');
  const standby = join(dir, 'standby');
  const pids: number[] = [];
  const url = (port: number, db = 'postgres') => `postgres://postgres@127.0.0.1:${port}/${db}`;
  const start = async (data: string, port: number) => {
    await asOwner('pg_ctl', ['-D', data, '-l', join(dir, `${port}.log`), '-w', '-t', '60', 'start']);
    await waitReady(port);
    pids.push(Number((await readFile(join(data, 'postmaster.pid'), 'utf8')).split('\n')[0]));
  };
  const stop = async () => {
    for (const data of [primary, standby]) await asOwner('pg_ctl', ['-D', data, '-m', 'immediate', 'stop']).catch(() => undefined);
    for (const pid of pids) await killTree(pid);
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await setUp();
  } catch (err) {
    await stop(); // nothing is left behind by a pair that did not start
    throw err;
  }
  async function setUp() {
    await asOwner('initdb', ['-D', primary, '-U', 'postgres', '-A', 'trust', '--no-sync']);
    await appendFile(
      join(primary, 'postgresql.auto.conf'),
      [
        `port = ${primaryPort}`,
        `listen_addresses = '127.0.0.1'`,
        `unix_socket_directories = '${dir}'`,
        'wal_level = replica',
        'max_wal_senders = 4',
        ...(synchronous ? ["synchronous_standby_names = '*'", 'synchronous_commit = on'] : []),
        'max_connections = 100',
        'fsync = off', // the test loses processes, not the machine: the page cache outlives them
        '',
      ].join('\n'),
    );
    await start(primary, primaryPort);
    await asOwner('pg_basebackup', ['-h', '127.0.0.1', '-p', String(primaryPort), '-U', 'postgres', '-D', standby, '-R', '-X', 'stream', '--no-sync']);
    // Once promoted it has no standby of its own: waiting for one would hold every commit.
    await appendFile(join(standby, 'postgresql.auto.conf'), `port = ${standbyPort}\nsynchronous_standby_names = ''\n`);
    await start(standby, standbyPort);
    // Synchronous from here: the primary waits for the standby's flush before it acknowledges a commit.
    const admin = new pg.Client({ connectionString: url(primaryPort) });
    await admin.connect();
    try {
      for (let i = 0; ; i++) {
        const { rows } = await admin.query<{ sync_state: string; state: string }>('SELECT sync_state, state FROM pg_stat_replication');
        if (synchronous ? rows[0]?.sync_state === 'sync' : rows[0]?.state === 'streaming') break;
        if (i > 300) throw new Error(synchronous ? 'the standby never became synchronous' : 'the standby never streamed');
        await new Promise((r) => setTimeout(r, 100));
      }
    } finally {
      await admin.end();
    }
  }
  return {
    primaryPort,
    standbyPort,
    url,
    /** The primary machine lost: its postmaster and every backend SIGKILLed at once. */
    killPrimary: () => killTree(pids[0]),
    promote: () => asOwner('pg_ctl', ['-D', standby, '-w', '-t', '60', 'promote']),
    /** The standby gone (an immediate stop: its connections drop at once). */
    stopStandby: () => asOwner('pg_ctl', ['-D', standby, '-m', 'immediate', 'stop']),
    /** What the servers logged (to explain a failure). */
    logs: async () => (await Promise.all([primaryPort, standbyPort].map((p) => readFile(join(dir, `${p}.log`), 'utf8').catch(() => '')))).join('\n'),
    stop,
  };
}
