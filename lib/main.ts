import { dependencyFailed, loadConfig, type Config } from './config';
import { createContainer, type Container } from './container';
import { ensureDatabase, openDatabase } from '../db/knex';
import { migrateLatest } from '../db/migrate';
import { startHeartbeat } from './heartbeats';

export type Role = 'web' | 'worker' | 'scheduler';
const ROLES: Record<string, Role[]> = { web: ['web'], worker: ['worker'], scheduler: ['scheduler'], all: ['web', 'worker', 'scheduler'] };

/** Creates the database when missing and applies pending migrations (knex's lock serialises racers). */
export async function prepareDatabase(config: Config): Promise<string[]> {
  await ensureDatabase(config.databaseUrl).catch((err: unknown) => {
    throw dependencyFailed('DATABASE_URL', config.databaseUrl, 'connecting to Postgres', err);
  });
  const db = openDatabase(config, { max: 1 });
  try {
    return await migrateLatest(db);
  } finally {
    await db.destroy();
  }
}

export interface Service {
  container: Container;
  port?: number;
  /** The worker's /healthz, /readyz and /metrics server, when WORKER_HTTP_PORT is set. */
  workerHttpPort?: number;
  stop: () => Promise<void>;
}

/** Starts the given roles in this process; `stop` shuts them down in order (API first, workers drain). */
export async function startService(roles: Role[], config: Config = loadConfig(), container?: Container): Promise<Service> {
  // Migrations first: the container loads the keyring from the database.
  const applied = await prepareDatabase(config);
  const c = container ?? (await createContainer(config));
  if (applied.length) c.log.info({ applied }, 'migrations applied');
  const stops: (() => Promise<void>)[] = [];
  let port: number | undefined;
  let workerHttpPort: number | undefined;
  // Each role loads only its own code: a worker process never loads the HTTP stack (~13 MiB of RSS).
  if (roles.includes('web')) {
    const { startWeb } = await import('../api/server');
    const web = await startWeb(c);
    port = web.port;
    stops.push(web.close);
  }
  if (roles.includes('worker')) {
    const { startWorkers } = await import('../workers/worker');
    stops.push((await startWorkers(c, config.workerQueues)).close);
    if (config.monitoring.workerHttpPort !== undefined) {
      const { startHealthServer } = await import('../workers/health-server');
      const health = await startHealthServer(c, config.monitoring.workerHttpPort);
      workerHttpPort = health.port;
      stops.unshift(health.close);
    }
  }
  if (roles.includes('scheduler')) {
    const { startScheduler } = await import('../workers/scheduler');
    stops.push((await startScheduler(c)).close);
  }
  if (roles.includes('web') || roles.includes('scheduler')) {
    const { startAuditRelay } = await import('./audit-relay');
    const { startEventRelay } = await import('./events');
    stops.push(startAuditRelay(c).stop, startEventRelay(c).stop);
  }
  if (roles.length) {
    // Beats until every role has stopped: a worker still finishing its jobs still seals.
    const heartbeat = startHeartbeat(
      c.redis,
      config.redisPrefix,
      { roles, queues: roles.includes('worker') ? config.workerQueues : [] },
      () => ({ keyring: c.keyring.state() }),
      c.redisOutage,
    );
    c.keyring.onChange(() => heartbeat.beat());
    stops.push(heartbeat.stop);
  }
  return {
    container: c,
    port,
    workerHttpPort,
    async stop() {
      for (const stop of stops) await stop();
      await c.close();
    },
  };
}

export interface Notice {
  level: 'info' | 'warn';
  fields: Record<string, unknown>;
  text: string;
}

/** What the person who started the service should read once: where it answers, and what is unsafe about it. */
export function startupNotices(config: Config, port: number | undefined): Notice[] {
  const notices: Notice[] = [];
  if (port !== undefined) {
    // PORT=0 takes any free port: the URLs name the one taken.
    const base = config.port === 0 ? config.publicUrl.replace(/:0$/, `:${port}`) : config.publicUrl;
    const urls = {
      api_url: `${base}/api/v1`,
      console_url: `${base}/`,
      queue_dashboard_url: config.monitoring.queueDashboard === 'off' ? undefined : `${base}/admin/queues`,
    };
    const dashboard = urls.queue_dashboard_url ? `, queue dashboard ${urls.queue_dashboard_url}` : '';
    notices.push({ level: 'info', fields: urls, text: `The service is ready: console ${urls.console_url}, API ${urls.api_url}${dashboard}.` });
  }
  const dev = config.developmentSecrets;
  if (dev.length) {
    const names = dev.join(' and ');
    const what = dev.length > 1 ? 'are the public development values' : 'is the public development value';
    notices.push({
      level: 'warn',
      fields: { settings: dev },
      text: `${names} ${what}: anyone can open what this service seals or sign in as anyone. Set your own before it holds anything real.`,
    });
  }
  return notices;
}

async function main() {
  const role = process.argv[2] ?? 'all';
  const roles = ROLES[role];
  if (!roles) throw new Error(`usage: main.ts ${Object.keys(ROLES).join('|')}`);
  const service = await startService(roles);
  const { log, config } = service.container;
  // A person at a terminal reads a plain line; anything else (a log collector) gets one JSON record per line.
  for (const notice of startupNotices(config, service.port)) {
    if (process.stderr.isTTY) process.stderr.write(`${notice.text}\n`);
    else log[notice.level](notice.fields, notice.text);
  }
  let stopping = false;
  const shutdown = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'shutting down: finishing active work');
    service.stop().then(
      () => process.exit(0),
      (err) => {
        log.error({ err }, 'unclean shutdown');
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((err) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  });
}
