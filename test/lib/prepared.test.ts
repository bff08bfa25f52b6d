import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { randomUUID } from 'node:crypto';
import { createDb, dropDatabase, ensureDatabase, prepared, preparedStatements, type Db } from '../../db/knex';
import { findUserJob } from '../../db/jobs';
import { retireActive } from '../../db/keys';
// The modules that define the service's prepared statements.
import '../../db/api-keys';
import '../../db/jobs';
import '../../db/keys';
import '../../db/partner-keys';
import '../../db/teams';
import '../../db/users';

describe('prepared statements', () => {
  it('name every column they read or return: a prepared * breaks when a migration adds a column under a running process', () => {
    expect(preparedStatements.size).toBeGreaterThan(10);
    for (const [name, sql] of preparedStatements) {
      const star = sql.replace(/count\(\*\)/gi, '').match(/\*/);
      expect(star, `${name}: ${sql}`).toBeNull();
    }
  });

  it('refuse a name defined twice (the driver would reject the second text on a connection that has the first)', () => {
    const [name] = preparedStatements.keys();
    expect(() => prepared(name, 'SELECT 1')).toThrow(/defined twice/);
  });
});

describe('a prepared statement whose result type a migration changed under the running process', () => {
  const url = new URL(inject('pgBase'));
  url.pathname = `/${inject('runId')}_prepared`;
  let db: Db;
  const read = prepared<{ id: number; v: number | string }>('test_stale_plan', 'SELECT id, v FROM t WHERE id = :id');
  beforeAll(async () => {
    await ensureDatabase(url.toString());
    db = createDb(url.toString(), { max: 1 }); // one connection: the one that holds the first plan
    await db.raw('CREATE TABLE t (id int PRIMARY KEY, v int)');
    await db.raw('INSERT INTO t VALUES (1, 10)');
  });
  afterAll(async () => {
    await db?.destroy();
    await dropDatabase(url.toString());
  });

  it('goes on under a new name (outside a transaction at once, inside at the next attempt)', async () => {
    expect(await read(db, { id: 1 })).toEqual([{ id: 1, v: 10 }]);
    await db.raw('ALTER TABLE t ALTER COLUMN v TYPE bigint');
    expect(await read(db, { id: 1 })).toEqual([{ id: 1, v: 10 }]); // int8 is parsed as a number (db/knex.ts)
    await db.raw('ALTER TABLE t ALTER COLUMN v TYPE text');
    await expect(db.transaction((trx) => read(trx, { id: 1 }))).rejects.toThrow(/cached plan must not change result type/);
    expect(await db.transaction((trx) => read(trx, { id: 1 }))).toEqual([{ id: 1, v: '10' }]);
  });

  it('binds each :name where it occurs, refuses a missing one, and keeps a transaction to its connection', async () => {
    const pair = prepared<{ a: number; b: string; again: number }>(
      'test_bindings',
      'SELECT CAST(:a AS int) AS a, CAST(:b AS text) AS b, CAST(:a AS int) + 1 AS again',
    );
    expect(await pair(db, { a: 1, b: 'x' })).toEqual([{ a: 1, b: 'x', again: 2 }]);
    expect(await pair(db, { a: 1, b: null })).toEqual([{ a: 1, b: null, again: 2 }]);
    await expect(pair(db, { a: 1 })).rejects.toThrow(/no value for :b/);
    expect(() => prepared('test_cast', 'SELECT :a::int')).toThrow(/CAST/);
    // In a transaction it sees the transaction's own writes (one connection in the pool: any other would wait).
    let seen: unknown;
    await db
      .transaction(async (trx) => {
        await trx.raw('INSERT INTO t VALUES (2, 20)');
        seen = await read(trx, { id: 2 });
        await trx.rollback();
      })
      .catch(() => undefined); // the rollback rejects the transaction's promise
    expect(seen).toEqual([{ id: 2, v: '20' }]);
    expect(await read(db, { id: 2 })).toEqual([]);
  });
});

/**
 * A connection keeps the plan it made of a prepared statement until the table's statistics change. One made
 * on a fresh database (empty tables, never analyzed) must still read a row by its key once the table has
 * grown: in the bench, `user_job` had taken the (user_id, created_at) index and read every job of the account.
 */
describe('prepared statements planned before the tables have statistics', () => {
  const url = new URL(inject('pgBase'));
  url.pathname = `/${inject('runId')}_plans`;
  let db: Db;
  const owner = randomUUID();
  const stranger = randomUUID();
  beforeAll(async () => {
    await ensureDatabase(url.toString(), inject('templateDb'));
    db = createDb(url.toString(), { max: 1 }); // one connection: the one that keeps the plans
    await db.raw('SET plan_cache_mode = force_generic_plan'); // planned once, as after a few executions
    for (const id of [owner, stranger]) await db('users').insert({ id, username: id, email: `${id}@example.com`, password_hash: 'x' });
  });
  afterAll(async () => {
    await db?.destroy();
    await dropDatabase(url.toString());
  });

  /** The scans of `statement`'s plan, run (in a transaction rolled back) with `args` as literals, one per `:name` in order. */
  async function scans(statement: string, args: string[]) {
    type Node = {
      'Node Type': string;
      'Relation Name'?: string;
      'Index Name'?: string;
      'Index Cond'?: string;
      'Rows Removed by Filter'?: number;
      Plans?: Node[];
    };
    const flat = (n: Node): Node[] => [n, ...(n.Plans ?? []).flatMap(flat)];
    let plan: Node | undefined;
    await db
      .transaction(async (trx) => {
        const { rows } = await trx.raw(`EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE ${statement}(${args.map((a) => `'${a}'`).join(', ')})`);
        plan = (rows[0]['QUERY PLAN'] as { Plan: Node }[])[0].Plan;
        await trx.rollback();
      })
      .catch((err: unknown) => {
        if (!plan) throw err; // else the rollback's own rejection
      });
    return flat(plan!).filter((n) => n['Node Type'].endsWith('Scan') && n['Relation Name'] !== undefined);
  }

  it('user_job reads one job by its primary key, however many jobs its account has', async () => {
    const id = randomUUID();
    expect(await findUserJob(db, owner, id)).toBeUndefined(); // planned now, on an empty table
    await db('jobs').insert(Array.from({ length: 300 }, () => ({ id: randomUUID(), user_id: owner, kind: 'encrypt' })));
    await db('jobs').insert({ id, user_id: owner, kind: 'encrypt' });
    expect((await findUserJob(db, owner, id))?.id).toBe(id);
    expect(await findUserJob(db, stranger, id)).toBeUndefined(); // the owner is still checked
    const [jobs] = (await scans('user_job', [id])).filter((n) => n['Relation Name'] === 'jobs');
    expect(jobs).toMatchObject({ 'Index Name': 'jobs_pkey' });
    expect(jobs['Rows Removed by Filter'] ?? 0).toBe(0);
  });

  it("retire_active looks up the lineage's current generation by its lineage, not through every current key", async () => {
    const lineage = randomUUID();
    expect(await retireActive(db, lineage, 1, new Date())).toBe(false); // planned now, on empty tables
    const lineages = [lineage, ...Array.from({ length: 300 }, () => randomUUID())];
    const common = {
      user_id: owner,
      environment: 'production',
      uid_name: 'n',
      uid_email: 'n@example.com',
      algorithm: 'curve25519',
      unlock_public: 'x',
      unlock_locked: 'x',
    };
    await db('key_lineages').insert(lineages.map((id, i) => ({ id, label: `k${i}`, ...common })));
    await db('pgp_keys').insert(
      lineages.map((id, i) => ({
        lineage_id: id,
        user_id: owner,
        generation: 1,
        fingerprint: `f${i}`,
        encryption_key_ids: [],
        algorithm: 'curve25519',
        public_armored: 'x',
        private_sealed: 'x',
        secret_sealed: 'x',
      })),
    );
    const keys = (await scans('retire_active', [lineage, new Date().toISOString(), lineage, '1'])).filter((n) => n['Relation Name'] === 'pgp_keys');
    expect(keys).toHaveLength(1);
    expect(keys[0]).toMatchObject({ 'Index Cond': expect.stringMatching(/lineage_id = /) });
    expect(keys[0]['Rows Removed by Filter'] ?? 0).toBe(0);
    expect(await retireActive(db, lineage, 1, new Date())).toBe(true);
  });
});
