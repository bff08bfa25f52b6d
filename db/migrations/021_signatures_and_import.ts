import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // A managed key holds private keys (generated or imported); a recipient key is an imported public key
  // that encrypts and verifies only: its lineage has no unlock key ('' columns) and its generation no
  // private key.
  await knex.raw(`ALTER TABLE key_lineages ADD COLUMN kind text NOT NULL DEFAULT 'managed' CHECK (kind IN ('managed', 'recipient'))`);
  await knex.raw(`ALTER TABLE pgp_keys ADD COLUMN imported boolean NOT NULL DEFAULT false`);
  // A live generation has both sealed secrets, or (a recipient key's) neither; a destroyed one has neither.
  await knex.raw('ALTER TABLE pgp_keys DROP CONSTRAINT pgp_keys_destroyed_check');
  await knex.raw(`ALTER TABLE pgp_keys ADD CONSTRAINT pgp_keys_destroyed_check CHECK (
    (destroyed_at IS NULL AND (private_sealed <> '') = (secret_sealed <> ''))
    OR (destroyed_at IS NOT NULL AND private_sealed = '' AND secret_sealed = ''))`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('ALTER TABLE pgp_keys DROP CONSTRAINT pgp_keys_destroyed_check');
  await knex.raw(`ALTER TABLE pgp_keys ADD CONSTRAINT pgp_keys_destroyed_check CHECK (
    (destroyed_at IS NULL AND private_sealed <> '' AND secret_sealed <> '')
    OR (destroyed_at IS NOT NULL AND private_sealed = '' AND secret_sealed = ''))`);
  await knex.raw('ALTER TABLE pgp_keys DROP COLUMN imported');
  await knex.raw('ALTER TABLE key_lineages DROP COLUMN kind');
}
