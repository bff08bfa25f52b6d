import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // The data keys that seal values and MAC rows (lib/root-of-trust/keyring.ts), each wrapped by a root key
  // (MASTER_KEY or a PKCS#11 token object) named by root_id. The current key is the live one with the
  // latest current_from in the past; a retired key keeps its row (so a value under it is named) but not
  // its material.
  await knex.schema.createTable('keyring', (t) => {
    t.text('kid').primary();
    t.text('wrapped');
    t.text('root_id').notNullable();
    t.timestamp('current_from', { useTz: true });
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('retired_at', { useTz: true });
  });
  await knex.raw(`ALTER TABLE keyring ADD CONSTRAINT keyring_retired_has_no_material CHECK ((retired_at IS NULL) = (wrapped IS NOT NULL))`);
  // A re-seal run: every sealed column and row MAC moved to target_kid, in batches; `position` is where
  // it resumes after a crash (column index and the last key of that column's table done).
  await knex.schema.createTable('keyring_reseals', (t) => {
    t.text('target_kid').primary().references('kid').inTable('keyring');
    t.jsonb('position').notNullable();
    t.bigInteger('resealed').notNullable().defaultTo(0);
    t.bigInteger('skipped').notNullable().defaultTo(0);
    t.timestamp('started_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('finished_at', { useTz: true });
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('keyring_reseals');
  await knex.schema.dropTable('keyring');
}
