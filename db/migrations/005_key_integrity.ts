import type { Knex } from 'knex';
import { backfillKeyMacs } from '../../lib/integrity';
import type { Sealer } from '../../lib/sealer';

/**
 * MACs under the master key over the public columns that decide where data is encrypted (see
 * lib/integrity.ts). Rows that exist when this migration runs get their MACs here, in its transaction,
 * and only here: a MAC that is missing later is a changed row and is refused, never re-made.
 * Backfilling needs the master key: it is read from the environment (MASTER_KEY, MASTER_KEYS_PREVIOUS),
 * as the process that runs the migrations (npm start, npm run migrate) has it; a database with no keys
 * yet needs none.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('key_lineages', (t) => {
    t.text('unlock_mac');
  });
  await knex.schema.alterTable('pgp_keys', (t) => {
    t.text('public_mac');
  });
  const [{ n }] = (await knex('key_lineages').count<{ n: string }[]>({ n: '*' })) as [{ n: string }];
  if (Number(n) > 0) await backfillKeyMacs(knex, { sealer: await environmentSealer() });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('key_lineages', (t) => {
    t.dropColumn('unlock_mac');
  });
  await knex.schema.alterTable('pgp_keys', (t) => {
    t.dropColumn('public_mac');
  });
}

/** The master keys of this process's configuration (loaded only when there are rows to backfill). */
async function environmentSealer(): Promise<Sealer> {
  const [{ loadConfig }, { createSealer }] = await Promise.all([import('../../lib/config'), import('../../lib/sealer')]);
  const { masterKeys } = loadConfig();
  // Rows this old predate the keyring: their data key is MASTER_KEY itself (the keyring imports it later).
  if (!masterKeys.current) throw new Error('MASTER_KEY must be set to give the key rows from before row MACs their MACs');
  return createSealer(masterKeys.current, masterKeys.previous);
}
