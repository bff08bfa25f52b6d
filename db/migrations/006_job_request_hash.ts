import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // SHA-256 of what a job-submitting request asked for (fields without secrets, files' names, sizes and
  // digests): an Idempotency-Key replayed with a different request is refused instead of answered.
  await knex.schema.alterTable('jobs', (t) => {
    t.text('request_hash');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('jobs', (t) => {
    t.dropColumn('request_hash');
  });
}
