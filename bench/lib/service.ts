import { execFile, type ChildProcess } from 'node:child_process';
import { appendFileSync, readFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import pg from 'pg';
import { GiB, cpuSeconds, randomId, rssMiB, spawnTracked, stopChild } from './util';

const REPO = new URL('../../', import.meta.url).pathname;
const POSTGRES = 'postgres://postgres@127.0.0.1:5432';
const REDIS_URL = 'redis://127.0.0.1:6379';

/**
 * How the Procfile starts `role`: its environment assignments and node flags (package.json's scripts use the
 * same: test/operations/build.test.ts), so the bench measures the processes as they run (docs/performance.md, "Process flags").
 */
export function procfileCommand(role: string): { env: Record<string, string>; flags: string[] } {
  const line = readFileSync(join(REPO, 'Procfile'), 'utf8')
    .split('\n')
    .find((l) => l.startsWith(`${role}:`));
  return nodeCommand(line?.slice(role.length + 1) ?? '', role);
}

/** `[NAME=value …] node [--flag …] dist/main.js <role>` taken apart (a Procfile line, a package.json script's last command). */
export function nodeCommand(command: string, role: string): { env: Record<string, string>; flags: string[] } {
  const words = command.trim().split(/\s+/);
  const node = words.indexOf('node');
  const assignments = words.slice(0, Math.max(node, 0));
  if (node < 0 || !assignments.every((w) => /^[A-Z_]+=\S*$/.test(w)) || words.at(-2) !== 'dist/main.js' || words.at(-1) !== role) {
    throw new Error(`not a "[NAME=value …] node … dist/main.js ${role}" command: ${command}`);
  }
  return { env: Object.fromEntries(assignments.map((w) => [w.slice(0, w.indexOf('=')), w.slice(w.indexOf('=') + 1)])), flags: words.slice(node + 1, -2) };
}

/**
 * BENCH_CPU_PROF=<dir>: each service process writes a V8 CPU profile there when it exits
 * (`--cpu-prof`); `tsx bench/profile.ts <dir>` summarises them. Opt-in: profiling costs CPU itself.
 */
function profileFlags(): string[] {
  const dir = process.env.BENCH_CPU_PROF;
  return dir ? ['--cpu-prof', `--cpu-prof-dir=${dir}`] : [];
}

/** BENCH_NODE_FLAGS="--flag …": extra node flags for the service processes (after the defaults, so they win), for experiments. */
export const extraFlags = () => (process.env.BENCH_NODE_FLAGS ?? '').split(/\s+/).filter(Boolean);

/** BENCH_LOG_DIR=<dir>: each service process's whole output goes to <dir>/<name>.log (with BENCH_NODE_FLAGS=--trace-gc, its GC log). */
const logTo = (name: string) =>
  process.env.BENCH_LOG_DIR ? (data: Buffer) => appendFileSync(join(process.env.BENCH_LOG_DIR!, `${name}.log`), data) : undefined;

/**
 * What runs: the service as production runs it, built once per bench run (`npm run build` → dist/main.js,
 * as the Procfile starts it), so memory and CPU figures are those of production; `BENCH_SOURCE=tsx` runs
 * the TypeScript sources through tsx instead (~45 MiB more per process).
 */
const fromSource = () => process.env.BENCH_SOURCE === 'tsx';
let built: Promise<unknown> | undefined;
const ensureBuilt = () => (fromSource() ? Promise.resolve() : (built ??= promisify(execFile)(process.execPath, ['scripts/build.mjs'], { cwd: REPO })));
const entry = () => (fromSource() ? ['--import', 'tsx', 'lib/main.ts'] : ['dist/main.js']);

/** One node process of the service: `node dist/main.js <role>` (or the sources through tsx), so its pid is the real one. */
export interface ServiceProcess {
  name: string;
  child: ChildProcess;
  pid: number;
  /** Last lines of its output (pino JSON at LOG_LEVEL=warn), shown when something fails. */
  tail: string[];
}

/**
 * The service on a private database, Redis prefix and blob folder: one API process and worker
 * processes added on demand. `stop` ends them and removes everything they stored.
 */
export class Service {
  readonly procs: ServiceProcess[] = [];
  private readonly workerQueues: string[] = [];
  readonly database = `kms_bench_${randomId()}`;
  readonly redisPrefix = `kmsbench${randomId()}`;
  private port = 0;
  private stopped = false;

  constructor(
    private readonly dir: string,
    private readonly maxFileBytes: number,
    /** The blob store's settings (BLOB_STORE_URL and the like); default a folder in `dir`. */
    private readonly blobEnv: Record<string, string> = {},
  ) {}

  get blobDir(): string {
    return join(this.dir, 'blobs');
  }

  /** The service's database, as its processes reach it. */
  get databaseUrl(): string {
    return `${POSTGRES}/${this.database}`;
  }

  get baseUrl(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Starts the API (which creates the database and migrates) and waits for /health = 200. */
  async startWeb(): Promise<void> {
    await ensureBuilt();
    this.port = await freePort();
    const web = this.spawn('api', 'web', {});
    await this.waitForHealth(web);
  }

  /** Starts a worker process and waits until BullMQ sees it on its first queue. */
  async addWorker(queues: string): Promise<ServiceProcess> {
    const queue = queues.split(/[=,]/)[0];
    const before = await this.workersOn(queue);
    await ensureBuilt();
    const proc = this.spawn(`worker-${this.procs.filter((p) => p.name.startsWith('worker')).length + 1}`, 'worker', { WORKER_QUEUES: queues });
    this.workerQueues.push(queues);
    await this.until(proc, async () => (await this.workersOn(queue)) > before, 'the worker to register with BullMQ');
    return proc;
  }

  /** How many worker processes this bench started that take `queue`. */
  workerCount(queue: string): number {
    return this.workerQueues.filter((q) => q.split(',').some((entry) => entry.split('=')[0] === queue)).length;
  }

  /** Throws if a service process has exited before `stop`. */
  assertRunning(): void {
    const dead = this.procs.find((p) => p.child.exitCode !== null || p.child.signalCode !== null);
    if (dead && !this.stopped) throw new Error(`${dead.name} exited (${dead.child.exitCode ?? dead.child.signalCode}):\n${dead.tail.join('\n')}`);
  }

  /** Each process's peak resident set so far (VmHWM), or with `now` its resident set now (VmRSS), in MiB. */
  rss(now = false): Record<string, number | null> {
    return Object.fromEntries(this.procs.map((p) => [p.name, rssMiB(p.pid, now ? 'VmRSS' : 'VmHWM')]));
  }

  cpu(): Record<string, number> {
    return Object.fromEntries(this.procs.map((p) => [p.name, cpuSeconds(p.pid)]));
  }

  /**
   * VACUUM (ANALYZE) of the service's database, as autovacuum keeps a production one: the CI machines run
   * Postgres with autovacuum off, where each timed phase would read the dead rows of every phase before it
   * (Postgres's CPU per rotation grew by ~5–10 % from one phase to the next, whatever the worker count).
   */
  vacuum(): Promise<void> {
    return runSql(this.databaseUrl, 'VACUUM (ANALYZE)');
  }

  /**
   * Work counters so far, exact: Postgres write transactions (transaction ids assigned: the snapshot's xmax,
   * which this reading does not move), WAL bytes written (both for the whole cluster: read with nothing else running) and the commands
   * Redis has run (INFO commandstats, every client's).
   */
  async workCounters(): Promise<Record<string, number>> {
    const db = new pg.Client({ connectionString: this.databaseUrl });
    const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
    await db.connect();
    try {
      const { rows } = await db.query<{ xid: string; wal: string }>(
        `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xid, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') AS wal`,
      );
      const stats = await redis.info('commandstats');
      const redisCommands = [...stats.matchAll(/calls=(\d+)/g)].reduce((n, m) => n + Number(m[1]), 0);
      return { pg_write_xacts: Number(rows[0].xid), wal_kib: Number(rows[0].wal) / 1024, redis_commands: redisCommands };
    } finally {
      await db.end();
      redis.disconnect();
    }
  }

  /** Ends the processes, drops the database and deletes the Redis keys; safe to call twice. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    await Promise.all(this.procs.map((p) => stopChild(p.child)));
    await dropDatabase(this.database).catch((err: unknown) => console.error(`could not drop database ${this.database}:`, err));
    await deleteRedisKeys(this.redisPrefix).catch((err: unknown) => console.error(`could not delete Redis keys of ${this.redisPrefix}:`, err));
  }

  /** Output tails of every process, for failure reports. */
  logs(): string {
    return this.procs.map((p) => `--- ${p.name} (pid ${p.pid}, exit ${p.child.exitCode ?? p.child.signalCode ?? 'running'})\n${p.tail.join('\n')}`).join('\n');
  }

  private env(extra: Record<string, string>): NodeJS.ProcessEnv {
    return {
      ...process.env,
      NODE_ENV: 'development',
      DATABASE_URL: this.databaseUrl,
      REDIS_URL,
      REDIS_PREFIX: this.redisPrefix,
      PORT: String(this.port),
      BLOB_STORE_URL: this.blobDir,
      MAIL_DIR: join(this.dir, 'mail'),
      LOG_LEVEL: 'warn',
      WORKER_QUEUES: 'crypto=1,notify=1',
      // The local store as tuned for a virtualised host that takes freed memory back (docs/performance.md, "Spare files").
      BLOB_SPARE_MB: process.env.BLOB_SPARE_MB ?? '1024',
      // The bench's clients are one account sending many uploads at once.
      UPLOADS_PER_ACCOUNT: '64',
      MAX_FILE_BYTES: String(this.maxFileBytes),
      MAX_DECOMPRESSED_BYTES: String(Math.max(this.maxFileBytes, 16 * GiB)),
      ...this.blobEnv,
      ...extra,
    };
  }

  private spawn(name: string, role: string, extra: Record<string, string>): ServiceProcess {
    const procfile = procfileCommand(role);
    // The Procfile's environment as production has it, unless this shell sets the same name (experiments).
    const child = spawnTracked(process.execPath, [...procfile.flags, ...extraFlags(), ...profileFlags(), ...entry(), role], {
      cwd: REPO,
      env: { ...procfile.env, ...this.env(extra) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const proc: ServiceProcess = { name, child, pid: child.pid!, tail: [] };
    const log = logTo(name);
    const keep = (data: Buffer) => {
      log?.(data);
      proc.tail.push(...data.toString().trimEnd().split('\n'));
      proc.tail.splice(0, Math.max(0, proc.tail.length - 40));
    };
    child.stdout!.on('data', keep);
    child.stderr!.on('data', keep);
    this.procs.push(proc);
    return proc;
  }

  private async waitForHealth(proc: ServiceProcess): Promise<void> {
    const healthy = async () => {
      try {
        return (await fetch(`${this.baseUrl}/api/v1/health`)).status === 200;
      } catch {
        return false;
      }
    };
    await this.until(proc, healthy, 'GET /api/v1/health = 200');
  }

  /** Polls `ready` until true; fails early if the process exits, or after 60 s. */
  private async until(proc: ServiceProcess, ready: () => Promise<boolean>, what: string): Promise<void> {
    const deadline = Date.now() + 60_000;
    while (!(await ready())) {
      if (proc.child.exitCode !== null || proc.child.signalCode !== null)
        throw new Error(`${proc.name} exited while waiting for ${what}:\n${proc.tail.join('\n')}`);
      if (Date.now() > deadline) throw new Error(`${proc.name}: timed out after 60 s waiting for ${what}:\n${proc.tail.join('\n')}`);
      await sleep(100);
    }
  }

  /**
   * What a job that does not end is waiting for: its BullMQ state and the queue's counts, the rows of the
   * queue's active jobs, every Redis client (a frozen process's connections sit idle) and the service's
   * Postgres sessions that are not idle (what each runs or waits for, and on whom). It found the worker
   * that froze in a key export, holding its transactions open (lib/curve25519.ts).
   */
  async stuckJobReport(name: string, jobId: string): Promise<string> {
    const connection = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
    const queue = new Queue(name, { connection, prefix: `{${this.redisPrefix}}` });
    const db = new pg.Client({ connectionString: this.databaseUrl });
    try {
      await db.connect();
      const active = (await queue.getActive()).map((j) => j.id!);
      const report = {
        state: await queue.getJobState(jobId),
        counts: await queue.getJobCounts(),
        active: (await db.query('SELECT id, kind, state, attempts, started_at FROM jobs WHERE id = ANY($1::uuid[])', [active])).rows,
        redis_clients: ((await connection.client('LIST')) as string)
          .split('\n')
          .filter(Boolean)
          .map((l) =>
            l
              .split(' ')
              .filter((f) => /^(id|name|age|idle|flags|cmd)=/.test(f))
              .join(' '),
          ),
        postgres: (
          await db.query(
            `SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid) AS blocked_by, now() - xact_start AS in_transaction, left(query, 120) AS query
               FROM pg_stat_activity WHERE datname = current_database() AND state <> 'idle' AND pid <> pg_backend_pid()`,
          )
        ).rows,
      };
      return JSON.stringify(report);
    } finally {
      await Promise.allSettled([queue.close(), db.end()]);
      connection.disconnect();
    }
  }

  private async workersOn(name: string): Promise<number> {
    const connection = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
    // The service's BullMQ prefix is its REDIS_PREFIX in a Cluster hash tag (jobs/client.ts).
    const queue = new Queue(name, { connection, prefix: `{${this.redisPrefix}}` });
    try {
      return await queue.getWorkersCount();
    } finally {
      await queue.close();
      connection.disconnect();
    }
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

/** One statement on its own connection (utility statements the service's pool does not run). */
async function runSql(url: string, sql: string): Promise<void> {
  const db = new pg.Client({ connectionString: url });
  await db.connect();
  try {
    await db.query(sql);
  } finally {
    await db.end();
  }
}

const dropDatabase = (name: string) => runSql(`${POSTGRES}/postgres`, `DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);

async function deleteRedisKeys(prefix: string): Promise<void> {
  const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
  try {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `*${prefix}*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length) await redis.unlink(...keys);
    } while (cursor !== '0');
  } finally {
    redis.disconnect();
  }
}
