import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // A job's blob data key, sealed under the master key (lib/blob/data-keys.ts). Jobs from before keep
  // theirs as the blob jobs/<id>/key, so the column stays null for them.
  await knex.schema.alterTable('jobs', (t) => {
    t.text('data_key');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('jobs', (t) => t.dropColumn('data_key'));
}
