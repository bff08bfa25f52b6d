import type { Knex } from 'knex';

/**
 * A share link's token, sealed (AES-GCM under the master key, bound to the share id) beside the hash a
 * view looks it up by, so the owner's share lists can give a link back to whoever already has it. Rows
 * made before keep no sealed token: their lists answer no link (only the hash was ever stored).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw('ALTER TABLE share_links ADD COLUMN token_sealed text');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('ALTER TABLE share_links DROP COLUMN token_sealed');
}
