/**
 * What chaining audit rows costs (docs/audit-evidence.md): audit inserts per second through recordAudit
 * with the chain (digest in Node, link under the chain head's lock in Postgres) and without it (the same
 * table with the chain's triggers off and its digest optional: the insert as it was before), each as
 *   - one writer, one row per transaction (a request that audits once),
 *   - 50 concurrent writers of one account (they take turns at its chain head),
 *   - 50 concurrent writers of 50 accounts (no shared head),
 * with durable commits and with synchronous_commit off (the chain's own cost without the WAL flush).
 * Needs Postgres on 127.0.0.1:5432 (trust); runs on a private database it drops after.
 *
 *   npm run bench:audit -- [--rows N] [--runs N]     (default 4000 rows, best of 3)
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { createDb, dropDatabase, ensureDatabase, type Db } from '../db/knex';
import { migrateLatest } from '../db/migrate';
import { recordAudit } from '../db/audit';
import { sampleEntry, setChain } from './lib/audit';
import { intOption } from './lib/util';

const args = process.argv.slice(2);
const opt = (name: string, def: number) => intOption(args, name, def);
const ROWS = opt('--rows', 4000);
const RUNS = opt('--runs', 3);
const WRITERS = 50;

const base = new URL(process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres');
base.pathname = `/kms_bench_audit_${randomBytes(4).toString('hex')}`;
const url = base.toString();

const entry = sampleEntry;

/** Rows per second of `total` inserts by `writers` concurrent writers, writer w writing for account accounts[w % accounts.length]. */
async function insertRate(db: Db, accounts: string[], writers: number, total: number, chained: boolean): Promise<number> {
  let next = 0;
  const write = (userId: string, i: number) =>
    chained ? recordAudit(db, entry(userId, i)) : db('audit_logs').insert({ ...entry(userId, i), details: JSON.stringify(entry(userId, i).details) });
  const started = performance.now();
  await Promise.all(
    Array.from({ length: writers }, async (_, w) => {
      for (let i = next++; i < total; i = next++) await write(accounts[w % accounts.length], i);
    }),
  );
  return total / ((performance.now() - started) / 1000);
}

async function users(db: Db, n: number): Promise<string[]> {
  const rows = Array.from({ length: n }, () => {
    const id = randomUUID();
    return { id, username: `bench_${id.slice(0, 8)}`, email: `${id}@bench.test`, password_hash: 'x', company_name: 'Bench' };
  });
  await db('users').insert(rows);
  return rows.map((r) => r.id);
}

/** Off: the table as it was before the chain (bench/lib/audit.ts); on, on emptied tables (the off rows have no digest). */
async function chain(db: Db, on: boolean): Promise<void> {
  if (on) await db.raw('TRUNCATE audit_logs, audit_chains');
  await setChain(db, on);
}

await ensureDatabase(url);
const dbName = base.pathname.slice(1);
try {
  const setup = createDb(url, { max: 1 });
  await migrateLatest(setup);
  await setup.destroy();
  const report: { commit: string; results: { case: string; without: number; with: number; ratio: number }[] }[] = [];
  // Durable commits (what a request waits for), then without waiting for the WAL flush, which leaves
  // what the chain itself costs (hashing, the head's row lock) in plain view.
  for (const commit of ['on', 'off']) {
    const admin = createDb(url, { max: 1 });
    await admin.raw(`ALTER DATABASE ${dbName} SET synchronous_commit = ${commit}`);
    await admin.destroy();
    const db = createDb(url, { max: 20 });
    try {
      const one = await users(db, 1);
      const many = await users(db, WRITERS);
      const cases = [
        { name: '1 writer, 1 account', accounts: one, writers: 1 },
        { name: `${WRITERS} writers, 1 account`, accounts: one, writers: WRITERS },
        { name: `${WRITERS} writers, ${WRITERS} accounts`, accounts: many, writers: WRITERS },
      ];
      const results: { case: string; without: number; with: number; ratio: number }[] = [];
      for (const c of cases) {
        const best = { without: 0, with: 0 };
        for (let run = 0; run < RUNS; run++) {
          // Alternating, each on an emptied table, so that neither side inherits the other's bloat.
          await chain(db, false);
          await db.raw('TRUNCATE audit_logs');
          best.without = Math.max(best.without, await insertRate(db, c.accounts, c.writers, ROWS, false));
          await chain(db, true);
          best.with = Math.max(best.with, await insertRate(db, c.accounts, c.writers, ROWS, true));
        }
        results.push({ case: c.name, without: Math.round(best.without), with: Math.round(best.with), ratio: Number((best.with / best.without).toFixed(3)) });
      }
      report.push({ commit, results });
    } finally {
      await db.destroy();
    }
  }
  console.log(`audit inserts per second, ${ROWS} rows, one row per transaction, best of ${RUNS}`);
  for (const { commit, results } of report) {
    console.log(` synchronous_commit = ${commit}`);
    for (const r of results)
      console.log(
        `  ${r.case.padEnd(26)} without chain ${String(r.without).padStart(6)}/s   with chain ${String(r.with).padStart(6)}/s   (with/without ${r.ratio})`,
      );
  }
  console.log(JSON.stringify({ bench: 'audit-chain', rows: ROWS, runs: RUNS, report }));
} finally {
  await dropDatabase(url);
}
