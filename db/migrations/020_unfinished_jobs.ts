import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // The job reconciler reads the unfinished jobs every minute: a few rows among every job ever kept.
  await knex.raw(`CREATE INDEX jobs_unfinished_created_at ON jobs (created_at) WHERE state IN ('queued', 'active')`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP INDEX jobs_unfinished_created_at');
}
