import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createDb, dropDatabase, ensureDatabase, prepared, preparedStatements, type Db } from '../../db/knex';
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
    expect(() => prepared(name!, 'SELECT 1')).toThrow(/defined twice/);
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
    const pair = prepared<{ a: number; b: string; again: number }>('test_bindings', 'SELECT CAST(:a AS int) AS a, CAST(:b AS text) AS b, CAST(:a AS int) + 1 AS again');
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
