import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // MACs under the master key over the public columns that decide where data is encrypted (see
  // lib/services/key-integrity.ts). Rows from before this migration get theirs when a process starts.
  await knex.schema.alterTable('key_lineages', (t) => {
    t.text('unlock_mac');
  });
  await knex.schema.alterTable('pgp_keys', (t) => {
    t.text('public_mac');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('key_lineages', (t) => {
    t.dropColumn('unlock_mac');
  });
  await knex.schema.alterTable('pgp_keys', (t) => {
    t.dropColumn('public_mac');
  });
}
