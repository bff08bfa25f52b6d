import type { Knex } from 'knex';

/**
 * A fingerprint is unique within an account, not across the service: any number of accounts may hold
 * the same (public) key, and an account's holding says nothing to another. Fingerprint first, so the
 * index also finds every holder of a fingerprint (the lookups that then keep the caller's own and
 * granted rows).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw('ALTER TABLE pgp_keys DROP CONSTRAINT pgp_keys_fingerprint_unique');
  await knex.raw('CREATE UNIQUE INDEX pgp_keys_account_fingerprint ON pgp_keys (fingerprint, user_id)');
}

/** Fails while two accounts hold one fingerprint: going back would have to drop one of them. */
export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP INDEX pgp_keys_account_fingerprint');
  await knex.raw('ALTER TABLE pgp_keys ADD CONSTRAINT pgp_keys_fingerprint_unique UNIQUE (fingerprint)');
}
