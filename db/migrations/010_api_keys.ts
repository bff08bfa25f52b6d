import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // Managed API keys (`kms_sk_…`): several per account, each with scopes, an optional expiry, usage
  // counters, and its current value sealed under the master key (GET /api-keys/{key_id} shows it).
  await knex.schema.createTable('api_keys', (t) => {
    t.uuid('id').primary();
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    t.text('name').notNullable();
    // The current value's first characters (`kms_sk_` + 6), safe to show.
    t.text('prefix').notNullable();
    t.specificType('scopes', 'text[]').notNullable();
    // The current value, sealed with AAD `api-key-value:<id>:<current_secret_id>`; null once revoked.
    t.text('value_sealed');
    t.uuid('current_secret_id').notNullable();
    t.timestamp('expires_at', { useTz: true });
    t.timestamp('revoked_at', { useTz: true });
    t.timestamp('last_rotated_at', { useTz: true });
    // When the value replaced by the latest rotation stops working (display only: each value keeps its own).
    t.timestamp('previous_value_expires_at', { useTz: true });
    t.timestamp('last_used_at', { useTz: true });
    t.bigInteger('use_count').notNullable().defaultTo(0);
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['user_id', 'created_at']);
  });
  // Every value a key has had, by hash: the current one, and rotated ones (working until `valid_until`,
  // then answered `api_key_rotated` rather than `invalid_api_key`). Authentication is one lookup here.
  await knex.schema.createTable('api_key_secrets', (t) => {
    t.uuid('id').primary();
    t.uuid('key_id').notNullable().references('api_keys.id').onDelete('CASCADE');
    t.text('key_hash').notNullable().unique();
    t.text('prefix').notNullable();
    t.timestamp('rotated_at', { useTz: true });
    t.timestamp('valid_until', { useTz: true });
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['key_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('api_key_secrets');
  await knex.schema.dropTableIfExists('api_keys');
}
