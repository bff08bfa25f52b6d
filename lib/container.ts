import { dependencyFailed, type Config } from './config';
import { createLogger, type Logger } from './logger';
import { openDatabase, openReplicaDatabase, type Db } from '../db/knex';
import { createRedis, connectRedis, type Redis } from './redis';
import { RedisOutageLog } from './redis-outage';
import { sealerOver, type Sealer } from './sealer';
import { ensureKeyring, Keyring, rootsOf } from './root-of-trust/keyring';
import { lineageKeysOf, type LineageKeys } from './root-of-trust/lineage-keys';
import { createMailer, type Mailer } from './mailer';
import { systemClock, type Clock } from './clock';
import { JobClient } from '../jobs/client';
import { createLimiters, type Limiters } from './auth/limiters';
import { createBlobStore } from './blob';
import { sealedJobBlobs } from './blob/sealed';
import { jobDataKeys, type JobDataKeys } from './blob/data-keys';
import { followableJobFiles, type JobBlobStore } from './blob/followable';
import { setLineageKdf } from './lineage';
import { createMetrics, type Metrics } from './metrics';
import { UsageRecorder } from './usage';
import { EventHub } from './event-hub';
import { addUse } from '../db/api-keys';
import { touchPartnerKey } from '../db/partner-keys';
import { jobDataKey } from '../db/jobs';
import { UntrustedPgp } from './pgp/untrusted';
import { ReplicaReads } from './replica-reads';

/**
 * The composition root: every long-lived dependency, built once per process and handed to the API,
 * the workers and the scheduler. Tests build their own with a private database, Redis prefix and clock.
 */
export interface Container {
  config: Config;
  log: Logger;
  /** The primary (DATABASE_URL): every write, and every read that must see the latest commit. */
  db: Db;
  /** Where a read that tolerates a little lag goes: the replica (DATABASE_REPLICA_URL) when it may, else `db`. */
  reads: ReplicaReads;
  redis: Redis;
  /** The data keys the sealer uses, wrapped by the root key (MASTER_KEY or a PKCS#11 token). */
  keyring: Keyring;
  sealer: Sealer;
  /** Per-lineage keys in the root key's token (LINEAGE_TOKEN_KEYS); its session opens on first use. */
  lineageKeys: LineageKeys;
  mailer: Mailer;
  jobs: JobClient;
  clock: Clock;
  limiters: Limiters;
  blob: JobBlobStore;
  /** The data keys job blobs are sealed under (made with a job, kept in its row). */
  jobKeys: JobDataKeys;
  metrics: Metrics;
  /** API keys' request counts and last use, written once a second. */
  usage: UsageRecorder;
  /** Live account events on one Redis reader for the whole process (connects on first use). */
  eventHub: EventHub;
  /** Where this process's connections and periodic work report Redis out of reach: logged once, not per error. */
  redisOutage: RedisOutageLog;
  /** Keys and signatures a caller sends, read and checked on threads stopped at a deadline (started on first use). */
  untrusted: UntrustedPgp;
  close(): Promise<void>;
}

export async function createContainer(config: Config, overrides: { clock?: Clock; log?: Logger } = {}): Promise<Container> {
  const log = overrides.log ?? createLogger(config.logLevel);
  setLineageKdf({ memoryKib: config.lineageKdfMemoryKib });
  const db = openDatabase(config, { log });
  const redis = createRedis(config, 'producer');
  const redisOutage = new RedisOutageLog(log);
  // Until the first connection, an error is what start-up fails with (one line naming REDIS_URL), not a log record.
  let connected = false;
  let refused: unknown;
  redis.on('error', (err: Error) => {
    if (!connected) refused = err;
    else if (!redisOutage.heard(err, 'producer')) log.warn({ err: err.message }, 'redis connection error');
  });
  redis.on('ready', () => redisOutage.ready());
  await connectRedis(redis).catch((err: unknown) => {
    redis.disconnect();
    throw config.redisClusterNodes.length
      ? dependencyFailed(
          'REDIS_CLUSTER_NODES',
          `redis://${config.redisClusterNodes[0].host}:${config.redisClusterNodes[0].port}`,
          'connecting to the Redis Cluster',
          refused ?? err,
        )
      : dependencyFailed('REDIS_URL', config.redisUrl, 'connecting to Redis', refused ?? err);
  });
  connected = true;
  const keyring = await openKeyring(config, db).catch(async (err: unknown) => {
    redis.disconnect();
    await db.destroy();
    throw err;
  });
  const metrics = createMetrics();
  keyring.onChange((state) => metrics.keyringReloadFailing.set(state.reload_error === null ? 0 : 1));
  keyring.start(config.masterKeys.refreshMs, (err) => {
    metrics.keyringReloadFailures.inc();
    log.warn({ err: err.message }, 'keyring reload failed; the keys known are kept');
  });
  const mailer = createMailer({ ...config.mail, smtpUrl: config.mail.smtpUrl, log });
  const jobs = new JobClient(redis, config.redisPrefix, (err) => redisOutage.heard(err, 'job queue') || log.warn({ err: err.message }, 'job queue error'));
  const sealer = sealerOver(keyring);
  const lineageKeys = lineageKeysOf(config.masterKeys);
  // Settings left unset fall through to the AWS SDK's own credential chain (instance roles, profiles).
  // Job blobs (uploads, outputs) are sealed at rest under a per-job data key; job files are written in
  // segments that readers can follow while they grow.
  const store = await createBlobStore(config.blob.url, { s3: config.blob.s3, spareBytes: config.blob.spareBytes, env: {} });
  const jobKeys = jobDataKeys(sealer, { lookup: (jobId) => jobDataKey(db, jobId), legacy: store });
  const blob = followableJobFiles(sealedJobBlobs(store, jobKeys));
  const usage = new UsageRecorder((kind, id, count, last) => (kind === 'api_key' ? addUse(db, id, count, last) : touchPartnerKey(db, id, last)), log);
  const eventHub = new EventHub({ redis, target: config, redisPrefix: config.redisPrefix, log, outage: redisOutage });
  const untrusted = new UntrustedPgp(config.untrusted, metrics);
  // Its pool connects on first use: a process that serves no reads (a worker) never connects to the replica.
  const replica = openReplicaDatabase(config, { log });
  const reads = new ReplicaReads({ primary: db, replica, redis, redisPrefix: config.redisPrefix, maxLagMs: config.databaseReplica?.maxLagMs ?? 0, log });
  return {
    config,
    log,
    db,
    reads,
    redis,
    keyring,
    sealer,
    lineageKeys,
    mailer,
    jobs,
    clock: overrides.clock ?? systemClock,
    limiters: createLimiters(redis, config),
    blob,
    jobKeys,
    metrics,
    usage,
    eventHub,
    redisOutage,
    untrusted,
    async close() {
      await untrusted.close();
      await eventHub.stop();
      await usage.close();
      await jobs.close();
      mailer.close();
      await blob.close();
      redis.disconnect();
      await lineageKeys.close();
      await keyring.close();
      await replica?.destroy();
      await db.destroy();
    },
  };
}

/**
 * The keyring under the configured root, loaded (the database is migrated). An empty keyring first gets
 * the MASTER_KEY and MASTER_KEYS_PREVIOUS keys that sealed what is stored (lib/root-of-trust/keyring.ts).
 */
export async function openKeyring(config: Config, db: Db): Promise<Keyring> {
  const roots = rootsOf(config.masterKeys);
  try {
    // The configured root opens first, so a wrong token, object or PIN is what start-up reports.
    roots.current();
    const { current, previous } = config.masterKeys;
    await ensureKeyring(db, roots, current ? [current, ...previous] : previous);
    const keyring = new Keyring(db, roots);
    await keyring.load();
    return keyring;
  } catch (err) {
    await roots.close();
    throw err;
  }
}
