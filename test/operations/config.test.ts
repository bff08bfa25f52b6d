import { describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { readFileSync } from 'node:fs';
import { loadConfig } from '../../lib/config';

/** Configuration fails closed: the public development secrets only where the environment says so. */
const key = (kid: string) => `${kid}:${randomBytes(32).toString('base64')}`;
const secrets = { MASTER_KEY: key('m1'), JWT_SECRET: randomBytes(24).toString('hex') };

describe('loadConfig', () => {
  it('refuses to start with NODE_ENV unset (or production) and no MASTER_KEY or JWT_SECRET', () => {
    expect(() => loadConfig({})).toThrow(/MASTER_KEY must be set/);
    expect(() => loadConfig({ MASTER_KEY: secrets.MASTER_KEY })).toThrow(/JWT_SECRET must be set/);
    expect(() => loadConfig({ NODE_ENV: 'production', JWT_SECRET: secrets.JWT_SECRET })).toThrow(/MASTER_KEY must be set/);
    expect(loadConfig(secrets).production).toBe(true);
  });

  it('runs on one Redis by default, and on a Redis Cluster when REDIS_CLUSTER_NODES names its seed nodes', () => {
    expect(loadConfig({ NODE_ENV: 'test' }).redisClusterNodes).toEqual([]);
    expect(loadConfig({ NODE_ENV: 'test', REDIS_CLUSTER_NODES: '10.0.0.5:7000, redis-b.internal:7001,[::1]:7002' }).redisClusterNodes).toEqual([
      { host: '10.0.0.5', port: 7000 },
      { host: 'redis-b.internal', port: 7001 },
      { host: '::1', port: 7002 },
    ]);
    for (const bad of ['10.0.0.5', '10.0.0.5:0', 'redis://10.0.0.5:7000', '10.0.0.5:70000', ':7000']) {
      expect(() => loadConfig({ NODE_ENV: 'test', REDIS_CLUSTER_NODES: bad })).toThrow(/REDIS_CLUSTER_NODES: bad entry/);
    }
  });

  it('reads only the primary unless DATABASE_REPLICA_URL names a replica, whose lag bound defaults to 5 s', () => {
    expect(loadConfig({ NODE_ENV: 'test' }).databaseReplica).toBeUndefined();
    const url = 'postgres://kms@replica.internal:5432/kms';
    expect(loadConfig({ NODE_ENV: 'test', DATABASE_REPLICA_URL: url }).databaseReplica).toEqual({ url, maxLagMs: 5000 });
    expect(loadConfig({ NODE_ENV: 'test', DATABASE_REPLICA_URL: url, DATABASE_REPLICA_MAX_LAG_SECONDS: '30' }).databaseReplica?.maxLagMs).toBe(30_000);
    expect(() => loadConfig({ NODE_ENV: 'test', DATABASE_REPLICA_URL: url, DATABASE_REPLICA_MAX_LAG_SECONDS: '0' })).toThrow(
      /DATABASE_REPLICA_MAX_LAG_SECONDS/,
    );
  });

  it('uses the development secrets only for NODE_ENV development or test', () => {
    expect(loadConfig({ NODE_ENV: 'development' }).masterKeys.current).toMatch(/^dev:/);
    expect(loadConfig({ NODE_ENV: 'test' }).jwt.secret.length).toBeGreaterThanOrEqual(32);
  });

  it('refuses the development master key among the previous keys outside development and test', () => {
    const dev = loadConfig({ NODE_ENV: 'development' }).masterKeys.current!;
    expect(() => loadConfig({ ...secrets, MASTER_KEYS_PREVIOUS: dev })).toThrow(/development master key/);
    expect(() => loadConfig({ ...secrets, MASTER_KEY: dev })).toThrow(/development master key/);
    // The same public key material under another id is still the development key.
    const renamed = `prod:${dev.slice(dev.indexOf(':') + 1)}`;
    expect(() => loadConfig({ ...secrets, MASTER_KEY: renamed })).toThrow(/development master key/);
    expect(() => loadConfig({ ...secrets, MASTER_KEYS_PREVIOUS: renamed })).toThrow(/development master key/);
    expect(loadConfig({ NODE_ENV: 'test', MASTER_KEYS_PREVIOUS: renamed }).masterKeys.previous).toEqual([renamed]);
  });

  it('names the settings that use their public development value (start-up warns of them)', () => {
    expect(loadConfig({ NODE_ENV: 'development' }).developmentSecrets).toEqual(['MASTER_KEY', 'JWT_SECRET']);
    expect(loadConfig({ NODE_ENV: 'test', JWT_SECRET: secrets.JWT_SECRET }).developmentSecrets).toEqual(['MASTER_KEY']);
    const dev = loadConfig({ NODE_ENV: 'development' }).masterKeys.current!;
    expect(loadConfig({ NODE_ENV: 'test', MASTER_KEY: `renamed:${dev.slice(dev.indexOf(':') + 1)}` }).developmentSecrets).toEqual(['MASTER_KEY', 'JWT_SECRET']);
    expect(loadConfig(secrets).developmentSecrets).toEqual([]);
  });

  it('refuses the development JWT secret outside development and test', () => {
    const devSecret = loadConfig({ NODE_ENV: 'development' }).jwt.secret;
    expect(() => loadConfig({ ...secrets, JWT_SECRET: devSecret })).toThrow(/JWT_SECRET is the public development secret/);
    expect(() => loadConfig({ ...secrets, NODE_ENV: 'production', JWT_SECRET: devSecret })).toThrow(/public development secret/);
  });

  it('a process started without NODE_ENV or secrets (as the Procfile does) exits with a clear message', async () => {
    const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: process.env.HOME };
    const run = promisify(execFile)(process.execPath, ['--import', 'tsx', 'lib/main.ts', 'web'], { env, timeout: 15_000 });
    const err = await run.then(
      () => null,
      (e: { code: number; stderr: string }) => e,
    );
    expect(err?.code).toBe(1);
    expect(err?.stderr).toMatch(/MASTER_KEY must be set .*NODE_ENV is unset \(counts as production\)/);
  });

  it('npm start (the quick start) runs with NODE_ENV=development unless told otherwise; the Procfile roles do not', () => {
    const scripts = JSON.parse(readFileSync('package.json', 'utf8')).scripts as Record<string, string>;
    // The node process that runs the service gets the development default; the build before it needs none.
    expect(scripts.start).toMatch(/(^|&& )NODE_ENV=\$\{NODE_ENV:-development\} (?:[A-Z_]+=\S+ )*node .*dist\/main\.js all$/);
    for (const role of ['web', 'worker', 'scheduler']) expect(scripts[role]).not.toContain('NODE_ENV');
    for (const line of readFileSync('Procfile', 'utf8').trim().split('\n')) expect(line).not.toContain('NODE_ENV');
  });

  it('refuses a master key id that appears twice (a previous key would replace the current one)', () => {
    expect(() => loadConfig({ ...secrets, MASTER_KEYS_PREVIOUS: key('m1') })).toThrow(/"m1" appears more than once/);
    expect(() => loadConfig({ ...secrets, MASTER_KEYS_PREVIOUS: `${key('old')},${key('old')}` })).toThrow(/"old"/);
    expect(loadConfig({ ...secrets, MASTER_KEYS_PREVIOUS: key('m0') }).masterKeys.previous).toHaveLength(1);
  });

  it('trusts no proxy by default', () => {
    expect(loadConfig({ NODE_ENV: 'test' }).trustedProxyCount).toBe(0);
    expect(loadConfig({ NODE_ENV: 'test', TRUSTED_PROXY_COUNT: '2' }).trustedProxyCount).toBe(2);
  });
});

describe('decompression limits', () => {
  it('cap a compressed message at MAX_FILE_BYTES by default, never above it, and all outputs of a job at 4 × MAX_FILE_BYTES', () => {
    const base = { NODE_ENV: 'test', MAX_FILE_BYTES: String(1 << 20) };
    expect(loadConfig(base).limits).toMatchObject({ maxDecompressedBytes: 1 << 20, maxJobOutputBytes: 4 << 20 });
    expect(loadConfig({ ...base, MAX_DECOMPRESSED_BYTES: String(1 << 30) }).limits.maxDecompressedBytes).toBe(1 << 20);
    expect(loadConfig({ ...base, MAX_DECOMPRESSED_BYTES: '1000', MAX_JOB_OUTPUT_BYTES: '5000' }).limits).toMatchObject({
      maxDecompressedBytes: 1000,
      maxJobOutputBytes: 5000,
    });
  });
});
