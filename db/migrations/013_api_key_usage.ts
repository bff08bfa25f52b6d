import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // Which managed API key submitted a job (null: a session or the partner key), so the key's usage
  // counts the bytes its jobs encrypt and decrypt, once, in the job's commit.
  await knex.schema.alterTable('jobs', (t) => {
    t.uuid('api_key_id').references('api_keys.id').onDelete('SET NULL');
  });
  await knex.schema.alterTable('api_keys', (t) => {
    t.bigInteger('bytes_encrypted').notNullable().defaultTo(0);
    t.bigInteger('bytes_decrypted').notNullable().defaultTo(0);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('api_keys', (t) => {
    t.dropColumn('bytes_encrypted');
    t.dropColumn('bytes_decrypted');
  });
  await knex.schema.alterTable('jobs', (t) => t.dropColumn('api_key_id'));
}
