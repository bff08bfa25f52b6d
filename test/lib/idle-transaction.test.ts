import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createDb, dropDatabase, ensureDatabase, type Db } from '../../db/knex';

describe('a transaction whose process stops answering', () => {
  const url = new URL(inject('pgBase'));
  url.pathname = `/${inject('runId')}_idle_tx`;
  let stalled: Db;
  let other: Db;
  beforeAll(async () => {
    await ensureDatabase(url.toString());
    stalled = createDb(url.toString(), { max: 1, idleInTransactionMs: 300 });
    other = createDb(url.toString(), { max: 1 });
    await other.raw('CREATE TABLE t (id int PRIMARY KEY, v int)');
    await other.raw('INSERT INTO t VALUES (1, 0)');
  });
  afterAll(async () => {
    await stalled?.destroy();
    await other?.destroy();
    await dropDatabase(url.toString());
  });

  it('loses its session and row locks after the idle limit, fails at its next statement, and the pool goes on', async () => {
    let woke = false;
    const held = stalled.transaction(async (trx) => {
      await trx('t').where({ id: 1 }).update({ v: 1 });
      await sleep(1500); // stands for a frozen event loop: nothing reaches the server meanwhile
      woke = true;
      await trx('t').where({ id: 1 }).update({ v: 2 });
    });
    const heldOutcome = held.then(
      () => 'committed',
      (err: Error) => err.message,
    );
    await sleep(50);
    // Another session waits on the row lock until the server ends the idle one, not for good.
    await other('t').where({ id: 1 }).update({ v: 3 });
    expect(woke).toBe(false);
    expect(await heldOutcome).toMatch(/connection error|terminat/); // at its next statement, or the ROLLBACK after it
    expect(await other('t').where({ id: 1 }).first()).toEqual({ id: 1, v: 3 }); // its first update rolled back
    expect((await stalled.raw('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
    // The limit is the process's setting, on every connection it opens.
    expect((await stalled.raw('SHOW idle_in_transaction_session_timeout')).rows[0]).toEqual({ idle_in_transaction_session_timeout: '300ms' });
  });
});
