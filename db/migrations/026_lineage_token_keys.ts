import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // A lineage made with LINEAGE_TOKEN_KEYS has its own key in the root key's token (lib/root-of-trust/lineage-keys.ts)
  // under which its generations' private keys are sealed: token_key says so (its later generations use it
  // too), token_key_deleted_at when the object was deleted, after its last generation was destroyed.
  await knex.schema.alterTable('key_lineages', (t) => {
    t.boolean('token_key').notNullable().defaultTo(false);
    t.timestamp('token_key_deleted_at', { useTz: true });
  });
  // The destruction sweep looks for token keys still to delete: few rows, found without a scan.
  await knex.raw('CREATE INDEX key_lineages_token_key_live ON key_lineages (id) WHERE token_key AND token_key_deleted_at IS NULL');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP INDEX key_lineages_token_key_live');
  await knex.schema.alterTable('key_lineages', (t) => {
    t.dropColumn('token_key_deleted_at');
    t.dropColumn('token_key');
  });
}
