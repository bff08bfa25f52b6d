import knexFactory, { type Knex } from 'knex';
import { createHash } from 'node:crypto';
import pg from 'pg';
import { DB_MESSAGE_CLEANED, redactDataException } from '../lib/logger';

export type { Knex };
export type Db = Knex;

/**
 * A write not yet run, for another statement to run with it (withWrites: `updateJob`'s and
 * `insertRotation`'s `alongside`): db/ composes it, services pass it on and never await it. Its rows are
 * `object` (`db<object>('table')`): writes to different tables go in one list, and a builder's row type
 * must match exactly.
 */
export type Write = Knex.QueryBuilder<object, unknown>;

// Postgres returns bigint (COUNT, bigserial) as strings; our counts fit in a JS number.
pg.types.setTypeParser(pg.types.builtins.INT8, (v: string) => Number(v));

export interface DbOptions {
  min?: number;
  max?: number;
  /**
   * Postgres ends a session left idle inside a transaction this long (`idle_in_transaction_session_timeout`,
   * DB_IDLE_IN_TRANSACTION_SECONDS), and with it the transaction and its row locks; unset or 0: the server's
   * setting.
   */
  idleInTransactionMs?: number;
  /**
   * Connections lead to a pooler in transaction mode (PgBouncer, DATABASE_POOL_MODE=transaction): each
   * transaction may run on another server connection, so nothing is kept in a session. No startup
   * parameters (PgBouncer refuses them; its `idle_transaction_timeout` ends a transaction left idle) and
   * no named prepared statements (`prepared` runs the same SQL unnamed).
   */
  transactionPooling?: boolean;
  /** How long a query waits for a pooled connection (a new one included) before it fails; default 10 s. */
  acquireTimeoutMs?: number;
  /** Where knex's own warnings go (lost connections, pool errors); unset: knex prints them to stderr. */
  log?: { warn(fields: object, message: string): void };
}

/** knex's warnings as one record each: its messages carry multi-line stacks, which only the first line needs. */
const knexLog = (log: NonNullable<DbOptions['log']>): Knex.Config['log'] => {
  const warn = (message: unknown) => log.warn({ source: 'knex' }, String(message).split('\n')[0]);
  return { warn, error: warn, deprecate: warn, debug: () => undefined };
};

/** The configs of pools behind a transaction-mode pooler (a transaction's client shares its pool's config). */
const transactionPooled = new WeakSet<object>();

export function createDb(databaseUrl: string, options: DbOptions = {}): Db {
  const idleMs = options.transactionPooling ? undefined : options.idleInTransactionMs;
  const db = knexFactory({
    client: 'pg',
    connection: { connectionString: databaseUrl, ...(idleMs ? { idle_in_transaction_session_timeout: idleMs } : {}) },
    pool: { min: options.min ?? 0, max: options.max ?? 10 },
    acquireConnectionTimeout: options.acquireTimeoutMs ?? 10_000,
    // A failing query's message starts with its SQL: with `$1` placeholders, never the bound values
    // (by default knex inlines bindings there, e.g. into a jsonb `\\?` it has unescaped).
    compileSqlOnError: false,
    ...(options.log ? { log: knexLog(options.log) } : {}),
  });
  // Emitted (for transactions too) before the error reaches the caller: clean it once, at the source.
  db.on('query-error', (err: unknown, query: { sql?: string } | undefined) => cleanQueryError(err, query?.sql));
  if (options.transactionPooling) transactionPooled.add(configOf(db));
  return db;
}

const configOf = (db: Knex): object => (db.client as { config: object }).config;

/** A knex client (of the database, a transaction or a query) that reaches Postgres through a transaction-mode pooler. */
const isPooledClient = (client: unknown): boolean => transactionPooled.has((client as { config: object }).config);

/** The database (or a transaction on it) is reached through a transaction-mode pooler. */
const isTransactionPooled = (db: Knex): boolean => isPooledClient(db.client);

/** The service's own pool, as configured: every process and CLI opens its database through this. */
export function openDatabase(
  config: { databaseUrl: string; dbIdleInTransactionMs: number; databasePoolMode: 'session' | 'transaction' },
  pool: Pick<DbOptions, 'max' | 'log' | 'acquireTimeoutMs'> = {},
): Db {
  return createDb(config.databaseUrl, {
    ...pool,
    idleInTransactionMs: config.dbIdleInTransactionMs,
    transactionPooling: config.databasePoolMode === 'transaction',
  });
}

/**
 * A replica whose connections hang must not hold a read for long: its reads go to the primary instead
 * (lib/replica-reads.ts), so a query gives up on a connection after this.
 */
const REPLICA_ACQUIRE_TIMEOUT_MS = 2000;

/** The pool of DATABASE_REPLICA_URL, configured as the primary's; undefined when no replica is set. */
export function openReplicaDatabase(
  config: { databaseReplica?: { url: string }; dbIdleInTransactionMs: number; databasePoolMode: 'session' | 'transaction' },
  pool: Pick<DbOptions, 'max' | 'log'> = {},
): Db | undefined {
  if (!config.databaseReplica) return undefined;
  return openDatabase({ ...config, databaseUrl: config.databaseReplica.url }, { ...pool, acquireTimeoutMs: REPLICA_ACQUIRE_TIMEOUT_MS });
}

const statements = new Map<string, string>();

/**
 * A statement Postgres parses and plans once per connection (a named prepared statement), for the few
 * queries nearly every request makes: for a simple query, parsing and planning are most of the CPU
 * Postgres spends on it (docs/performance.md). `sql` takes named bindings (`:name`), turned into
 * positional ones here, once; casts are written `CAST(x AS t)`, not `x::t`. It runs as a knex raw query
 * (on the pool or in a transaction) whose `name` option node-postgres turns into a named statement. It names the columns it
 * reads and returns: a prepared `SELECT *` would fail on every connection once a migration adds a column
 * while the process runs ("cached plan must not change result type"); a change of a named column's type
 * is recovered from below. A connection keeps its plan until the table's statistics change, and one made
 * on a fresh database has none: give each table's key as a parameter in its own condition (retire_active),
 * and check in code what another index could serve (the owner in findUserJob), so that no plan prefers it.
 * Behind a transaction-mode pooler the same SQL runs unnamed: a named statement lives on one server
 * connection, and the next transaction may run on another (or on one where another client named it).
 */
export function prepared<Row>(name: string, sql: string): (db: Knex, bindings: Record<string, unknown>) => Promise<Row[]> {
  if (statements.has(name)) throw new Error(`prepared statement "${name}" is defined twice`);
  if (/::|\?/.test(sql)) throw new Error(`prepared statement "${name}": write casts as CAST(x AS t), and no "?"`);
  statements.set(name, sql);
  const names: string[] = [];
  const text = sql.replace(/:([A-Za-z_]\w*)/g, (_, binding: string) => (names.push(binding), '?'));
  let version = 0;
  const nameOf = (v: number) => (v ? `${name}_${v}` : name);
  const run = async (db: Knex, values: Knex.RawBinding[], as: string): Promise<Row[]> => {
    const query = db.raw(text, values);
    return ((await (isTransactionPooled(db) ? query : query.options({ name: as }))) as { rows: Row[] }).rows;
  };
  return async (db, bindings) => {
    const values = names.map((n) => {
      if (bindings[n] === undefined) throw new Error(`prepared statement "${name}": no value for :${n}`);
      return bindings[n] as Knex.RawBinding;
    });
    const tried = version;
    try {
      return await run(db, values, nameOf(tried));
    } catch (err) {
      // A migration changed a column it returns while this process ran: a connection's plan of this name
      // stays stale for good, so the statement goes on under a new name, which each connection prepares
      // anew. In a transaction the error has aborted it: the caller's next attempt takes the new name.
      if (!isStalePlan(err)) throw err;
      if (version === tried) version++;
      if (db.isTransaction) throw err;
      return run(db, values, nameOf(version));
    }
  };
}

const isStalePlan = (err: unknown) => (err as { code?: string }).code === '0A000' && /cached plan must not change result type/.test((err as Error).message);

/** Every prepared statement defined so far, by name (test/lib/prepared.test.ts checks they name their columns). */
export const preparedStatements: ReadonlyMap<string, string> = statements;

/** Every column of a row type, as a list the compiler holds to the type (for statements that name their columns). */
export const columnsOf = <Row>(all: Record<keyof Row & string, 1>): (keyof Row & string)[] => Object.keys(all) as (keyof Row & string)[];

/**
 * Attaches `writes`, to other tables, to `query` as data-modifying CTEs: they run in the statement it
 * becomes (one round trip, atomic without a transaction). Each must touch its own rows: the parts of one
 * statement see one snapshot, and the order among them is not defined.
 */
export function withWrites<Row extends object, Result>(query: Knex.QueryBuilder<Row, Result>, writes: Write[]): void {
  for (const [i, write] of writes.entries()) query.with(`w${i}`, write);
}

/** Runs `writes` (at least one) as one statement: the first with the others attached (withWrites). */
export async function runWrites(writes: Write[]): Promise<void> {
  const [host, ...rest] = writes;
  withWrites(host, rest);
  await preparedByShape(host);
}

/** Shapes named so far (each becomes a statement on every connection that runs it): bounded, past that unnamed. */
const shapes = new Set<string>();
const MAX_SHAPES = 200;

/**
 * Runs a built write as a named prepared statement whose name is its SQL's digest, for the writes whose
 * SQL a builder makes but whose shape repeats (a job's completion with its alongside writes: one shape per
 * job kind and file count): Postgres parses and plans a statement of several data-modifying CTEs once per
 * connection instead of on every call. Only a statement that returns nothing: a plan whose result type a
 * migration changed fails (`prepared`), and one with no result cannot. Behind a transaction-mode pooler,
 * or once MAX_SHAPES are named, it runs unnamed.
 */
export function preparedByShape(query: Write): Write {
  if (isPooledClient(query.client)) return query;
  const { sql } = query.toSQL().toNative();
  if (/\breturning\b/i.test(sql)) return query;
  const name = `s_${createHash('sha1').update(sql).digest('hex').slice(0, 24)}`;
  if (!shapes.has(name)) {
    if (shapes.size >= MAX_SHAPES) return query;
    shapes.add(name);
  }
  return query.options({ name });
}

/**
 * A failed query's error as knex throws it: `<sql> - <Postgres message>`. A data exception's message
 * repeats the bad input (`invalid input syntax for type uuid: "<value>"`): that value goes, the SQL and
 * the rest stay. `detail` and `where`, where Postgres repeats values too, are left for the logger to drop.
 */
function cleanQueryError(err: unknown, sql: string | undefined): void {
  if (!(err instanceof Error)) return;
  const before = err.message;
  const prefix = sql && before.startsWith(`${sql} - `) ? `${sql} - ` : '';
  const after = prefix + redactDataException((err as { code?: string }).code, before.slice(prefix.length));
  if (after !== before) {
    err.message = after;
    if (typeof err.stack === 'string') err.stack = err.stack.split(before).join(after);
  }
  Object.defineProperty(err, DB_MESSAGE_CLEANED, { value: true, enumerable: false, configurable: true });
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

/** Queries of this process waiting for a pooled connection (knex's pool is tarn's; its type is not exported). */
export function waitingForConnection(db: Db): number {
  const pool = (db.client as { pool?: { numPendingAcquires?(): number } }).pool;
  return pool?.numPendingAcquires?.() ?? 0;
}

/** A round trip to Postgres (`select 1`): the readiness and status checks. */
export const pingDb = async (db: Knex): Promise<void> => {
  await db.raw('select 1');
};

/** One page of `rows`, newest first (by `created_at`, then `id`), and how many rows there are in all. */
export async function newestFirstPage<Row extends object>(
  rows: Knex.QueryBuilder<Row, unknown>,
  q: { page: number; pageSize: number },
): Promise<{ items: Row[]; total: number }> {
  const [items, count] = await Promise.all([
    rows
      .clone()
      .orderBy([
        { column: 'created_at', order: 'desc' },
        { column: 'id', order: 'desc' },
      ])
      .limit(q.pageSize)
      .offset((q.page - 1) * q.pageSize) as Promise<Row[]>,
    rows.clone().count<{ count: number }[]>({ count: '*' }),
  ]);
  return { items, total: count[0]?.count ?? 0 };
}
