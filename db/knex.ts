import knexFactory, { type Knex } from 'knex';
import pg from 'pg';

export type { Knex };
export type Db = Knex;

// Postgres returns bigint (COUNT, bigserial) as strings; our counts fit in a JS number.
pg.types.setTypeParser(pg.types.builtins.INT8, (v: string) => Number(v));

export function createDb(databaseUrl: string, pool: { min?: number; max?: number } = {}): Db {
  return knexFactory({
    client: 'pg',
    connection: databaseUrl,
    pool: { min: pool.min ?? 0, max: pool.max ?? 10 },
    acquireConnectionTimeout: 10_000,
  });
}

/** Creates the database named in the URL when it is missing (a fresh machine needs no manual step). */
export async function ensureDatabase(databaseUrl: string, template?: string): Promise<void> {
  const url = new URL(databaseUrl);
  const name = decodeURIComponent(url.pathname.slice(1));
  if (!/^[A-Za-z0-9_-]{1,63}$/.test(name)) throw new Error(`unsupported database name "${name}"`);
  url.pathname = '/postgres';
  const admin = new pg.Client({ connectionString: url.toString() });
  await admin.connect();
  try {
    const { rowCount } = await admin.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
    if (!rowCount) {
      const from = template ? ` TEMPLATE "${template}"` : '';
      await admin.query(`CREATE DATABASE "${name}"${from}`).catch((err: { code?: string }) => {
        if (err.code !== '42P04') throw err; // created meanwhile by another process
      });
    }
  } finally {
    await admin.end();
  }
}

export async function dropDatabase(databaseUrl: string): Promise<void> {
  const url = new URL(databaseUrl);
  const name = decodeURIComponent(url.pathname.slice(1));
  url.pathname = '/postgres';
  const admin = new pg.Client({ connectionString: url.toString() });
  await admin.connect();
  try {
    await admin.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
  } finally {
    await admin.end();
  }
}
