import pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';

const INTERVAL_MS = 3;
const TOP = 15;

/**
 * BENCH_PG_SAMPLE=1: where the service's Postgres sessions spend their time, section by section, without
 * pg_stat_statements (which needs the server restarted with it preloaded). pg_stat_activity is read every
 * few milliseconds; each session found active counts once under its statement and what it waits for
 * (`cpu` when nothing: running, or waiting on something Postgres does not name). It adds ~300 queries a
 * second to the run: a diagnosis, not a run to take figures from.
 *
 * Returns the function that stops sampling and gives the report's lines.
 */
export async function samplePostgres(databaseUrl: string, label: string): Promise<() => Promise<string[]>> {
  const db = new pg.Client({ connectionString: databaseUrl });
  let failure: string | undefined; // the first error's message
  db.on('error', (err) => (failure ??= err.message));
  await db.connect();
  const counts = new Map<string, number>();
  let samples = 0;
  let stopped = false;
  const t0 = Date.now();
  const loop = (async () => {
    while (!stopped) {
      const { rows } = await db.query<{ statement: string; wait: string }>(
        `SELECT regexp_replace(query, '\\s+', ' ', 'g') AS statement, coalesce(wait_event_type || ':' || wait_event, 'cpu') AS wait
           FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()`,
      );
      samples++;
      for (const { statement, wait } of rows) {
        // Statements of one table share their long column lists: keep both ends.
        const key = `${wait.padEnd(18)} ${statement.length > 170 ? `${statement.slice(0, 110)} … ${statement.slice(-55)}` : statement}`;
        counts.set(key, (counts.get(key) ?? 0) + 1);
      }
      await sleep(INTERVAL_MS);
    }
  })().catch((err: unknown) => {
    failure ??= err instanceof Error ? err.message : String(err); // reported at the end: the section goes on without its sampler
  });
  return async () => {
    stopped = true;
    await loop;
    await db.end().catch(() => {});
    const seconds = (Date.now() - t0) / 1000;
    const top = [...counts].sort((a, b) => b[1] - a[1]).slice(0, TOP);
    return [
      ...(failure ? [`Postgres sampling stopped early: ${failure}`] : []),
      `Postgres sessions active during ${label} (${samples} samples of pg_stat_activity over ${seconds.toFixed(1)} s; sessions at once on average, by statement and wait):`,
      ...top.map(([key, n]) => `  ${(n / samples).toFixed(3)}  ${key}`),
    ];
  };
}
