import type { Knex } from 'knex';

/**
 * OpenPGP profiles (lib/pgp/profiles.ts): each generation records the one its key was made or imported
 * under, and each lineage the one its next generation is made under (a rotation may change it, and
 * scheduled rotations follow it). Every key before this was a v4 key: `rfc4880`.
 */
export async function up(knex: Knex): Promise<void> {
  for (const table of ['key_lineages', 'pgp_keys']) {
    await knex.schema.alterTable(table, (t) => {
      t.text('profile').notNullable().defaultTo('rfc4880');
    });
    await knex.raw(`ALTER TABLE ?? ADD CONSTRAINT ?? CHECK (profile IN ('rfc4880', 'rfc9580', 'pqc'))`, [table, `${table}_profile_check`]);
  }
}

export async function down(knex: Knex): Promise<void> {
  for (const table of ['key_lineages', 'pgp_keys']) {
    await knex.schema.alterTable(table, (t) => {
      t.dropColumn('profile');
    });
  }
}
