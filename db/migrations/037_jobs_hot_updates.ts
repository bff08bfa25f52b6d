import type { Knex } from 'knex';

/**
 * A job's row is written three to five times in its life (recorded, upload ended, started, progress,
 * ended). An update that changes no indexed column, and finds room on the row's page, is a heap-only tuple
 * (HOT): no new entry in any of the table's five indexes. `state` was one, through the predicate of the
 * reconciler's index, so starting an attempt rewrote every index: the index now names the unfinished jobs
 * by `finished_at`, which every final state sets (queries keep their `state` condition too), and pages keep
 * a fifth free for the updates of the rows they hold.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw('CREATE INDEX jobs_unfinished_since ON jobs (created_at) WHERE finished_at IS NULL');
  await knex.raw('DROP INDEX jobs_unfinished_created_at');
  await knex.raw('ALTER TABLE jobs SET (fillfactor = 80)');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('ALTER TABLE jobs RESET (fillfactor)');
  await knex.raw(`CREATE INDEX jobs_unfinished_created_at ON jobs (created_at) WHERE state IN ('queued', 'active')`);
  await knex.raw('DROP INDEX jobs_unfinished_since');
}
