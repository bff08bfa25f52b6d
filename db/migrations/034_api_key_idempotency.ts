import type { Knex } from 'knex';

/**
 * `POST /api-keys/generate` honours Idempotency-Key as job submissions do (jobs.idempotency_key,
 * jobs.request_hash): the key a request made is found again by the client's key and the request's hash,
 * never by a stored copy of the value (the value stays sealed in value_sealed only).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('api_keys', (t) => {
    t.text('idempotency_key');
    t.text('request_hash');
  });
  await knex.raw('CREATE UNIQUE INDEX api_keys_idempotency ON api_keys (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP INDEX IF EXISTS api_keys_idempotency');
  await knex.schema.alterTable('api_keys', (t) => {
    t.dropColumn('idempotency_key');
    t.dropColumn('request_hash');
  });
}
