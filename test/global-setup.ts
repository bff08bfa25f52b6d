import { randomBytes } from 'node:crypto';
import type { TestProject } from 'vitest/node';
import pg from 'pg';
import { Redis } from 'ioredis';
import { createDb, dropDatabase, ensureDatabase } from '../db/knex';
import { migrateLatest } from '../db/migrate';
import { deleteKeysMatching } from '../lib/redis';

/**
 * One run = one migrated template database; each test file clones it (CREATE DATABASE … TEMPLATE is
 * fast) and uses its own Redis prefix. Everything the run made is dropped at the end.
 */
const PG_BASE = process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const REDIS_URL = process.env.TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';

declare module 'vitest' {
  export interface ProvidedContext {
    runId: string;
    pgBase: string;
    redisUrl: string;
    templateDb: string;
  }
}

const withDb = (name: string) => {
  const url = new URL(PG_BASE);
  url.pathname = `/${name}`;
  return url.toString();
};

export default async function setup(project: TestProject) {
  const runId = `kt${randomBytes(4).toString('hex')}`;
  const templateDb = `${runId}_template`;
  await ensureDatabase(withDb(templateDb));
  const db = createDb(withDb(templateDb), { max: 1 });
  await migrateLatest(db);
  await db.destroy();
  project.provide('runId', runId);
  project.provide('pgBase', PG_BASE);
  project.provide('redisUrl', REDIS_URL);
  project.provide('templateDb', templateDb);

  return async () => {
    const admin = new pg.Client({ connectionString: PG_BASE });
    await admin.connect();
    const { rows } = await admin.query<{ datname: string }>('SELECT datname FROM pg_database WHERE datname LIKE $1', [`${runId}%`]);
    await admin.end();
    for (const { datname } of rows) await dropDatabase(withDb(datname));
    const redis = new Redis(REDIS_URL);
    await deleteKeysMatching(redis, `*${runId}*`);
    redis.disconnect();
  };
}
