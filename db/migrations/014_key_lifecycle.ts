import type { Knex } from 'knex';

/**
 * Key lifecycle beyond rotation: retiring old generations (a per-lineage minimum generation
 * that may decrypt), scheduled destruction (crypto-shredding the sealed secret, keeping the public part
 * for history), per-generation usage counters, and expiry warnings sent once per generation and lead time.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('key_lineages', (t) => {
    // Generations below this no longer decrypt or rewrap (409 generation_retired); 1 retires nothing.
    t.integer('min_decryption_generation').notNullable().defaultTo(1);
    // Whole-key destruction: scheduled (the key is disabled at once) and done.
    t.timestamp('destroy_after', { useTz: true });
    t.timestamp('destroyed_at', { useTz: true });
  });
  await knex.raw('ALTER TABLE key_lineages ADD CONSTRAINT key_lineages_min_decryption_check CHECK (min_decryption_generation >= 1)');

  await knex.schema.alterTable('pgp_keys', (t) => {
    t.timestamp('destroy_after', { useTz: true });
    t.timestamp('destroyed_at', { useTz: true });
    t.bigInteger('encrypt_files').notNullable().defaultTo(0);
    t.bigInteger('encrypt_bytes').notNullable().defaultTo(0);
    t.bigInteger('decrypt_files').notNullable().defaultTo(0);
    t.bigInteger('decrypt_bytes').notNullable().defaultTo(0);
    t.timestamp('last_decrypt_at', { useTz: true });
    t.bigInteger('rewrap_from_files').notNullable().defaultTo(0);
    t.bigInteger('rewrap_to_files').notNullable().defaultTo(0);
  });
  // Crypto-shredding empties the sealed private key and its secret (''); everything public stays.
  await knex.raw(`ALTER TABLE pgp_keys ADD CONSTRAINT pgp_keys_destroyed_check CHECK (
    (destroyed_at IS NULL AND private_sealed <> '' AND secret_sealed <> '')
    OR (destroyed_at IS NOT NULL AND private_sealed = '' AND secret_sealed = ''))`);
  // The current generation is never destroyed on its own (only with its whole key, which is disabled).
  await knex.raw('CREATE INDEX pgp_keys_destroy_due ON pgp_keys (destroy_after) WHERE destroy_after IS NOT NULL AND destroyed_at IS NULL');

  // One row per (generation, lead time) warned about: a warning goes out once, whichever sweep claims it.
  await knex.schema.createTable('key_expiry_warnings', (t) => {
    t.uuid('key_id').notNullable().references('pgp_keys.id').onDelete('CASCADE');
    t.integer('lead_days').notNullable();
    t.timestamp('sent_at', { useTz: true }).notNullable();
    t.primary(['key_id', 'lead_days']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('key_expiry_warnings');
  await knex.raw('DROP INDEX IF EXISTS pgp_keys_destroy_due');
  await knex.raw('ALTER TABLE pgp_keys DROP CONSTRAINT IF EXISTS pgp_keys_destroyed_check');
  await knex.schema.alterTable('pgp_keys', (t) => {
    for (const col of [
      'destroy_after',
      'destroyed_at',
      'encrypt_files',
      'encrypt_bytes',
      'decrypt_files',
      'decrypt_bytes',
      'last_decrypt_at',
      'rewrap_from_files',
      'rewrap_to_files',
    ])
      t.dropColumn(col);
  });
  await knex.raw('ALTER TABLE key_lineages DROP CONSTRAINT IF EXISTS key_lineages_min_decryption_check');
  await knex.schema.alterTable('key_lineages', (t) => {
    for (const col of ['min_decryption_generation', 'destroy_after', 'destroyed_at']) t.dropColumn(col);
  });
}
