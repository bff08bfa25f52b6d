import { createHmac, hkdfSync } from 'node:crypto';
import type { Knex } from 'knex';

/**
 * MACs under the master key over the public columns that decide where data is encrypted (see
 * lib/integrity.ts). Rows that exist when this migration runs get their MACs here, in its transaction,
 * and only here: a MAC that is missing later is a changed row and is refused, never re-made.
 * Backfilling needs the master key: it is read from the environment (MASTER_KEY), as the process that
 * runs the migrations (npm start, npm run migrate) has it; a database with no keys yet needs none.
 *
 * The MAC is written out here, not imported: a migration does what it did when it was written, whatever
 * lib/ becomes later. It is the `m1` row MAC of lib/sealer.ts over the `v1` row data of lib/integrity.ts.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('key_lineages', (t) => {
    t.text('unlock_mac');
  });
  await knex.schema.alterTable('pgp_keys', (t) => {
    t.text('public_mac');
  });
  const [{ n }] = (await knex('key_lineages').count<{ n: string }[]>({ n: '*' })) as [{ n: string }];
  if (Number(n) > 0) await backfillKeyMacs(knex, rowMac(environmentMasterKey()));
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('key_lineages', (t) => {
    t.dropColumn('unlock_mac');
  });
  await knex.schema.alterTable('pgp_keys', (t) => {
    t.dropColumn('public_mac');
  });
}

type Mac = (data: string) => string;

/** Gives every row without a MAC its MAC (all rows, when this migration runs). */
async function backfillKeyMacs(db: Knex, mac: Mac): Promise<void> {
  const lineages = await db('key_lineages')
    .whereNull('unlock_mac')
    .select<{ id: string; user_id: string; unlock_public: string }[]>('id', 'user_id', 'unlock_public');
  for (const l of lineages) {
    await db('key_lineages')
      .where({ id: l.id })
      .whereNull('unlock_mac')
      .update({ unlock_mac: mac(JSON.stringify(['kms/lineage/v1', l.id, l.user_id, l.unlock_public])) });
  }
  const keys = await db('pgp_keys')
    .whereNull('public_mac')
    .select<
      { id: string; lineage_id: string; user_id: string; generation: number; fingerprint: string; encryption_key_ids: string[]; public_armored: string }[]
    >('id', 'lineage_id', 'user_id', 'generation', 'fingerprint', 'encryption_key_ids', 'public_armored');
  for (const k of keys) {
    const data = JSON.stringify(['kms/pgp-key/v1', k.lineage_id, k.user_id, k.generation, k.fingerprint, k.encryption_key_ids, k.public_armored]);
    await db('pgp_keys')
      .where({ id: k.id })
      .whereNull('public_mac')
      .update({ public_mac: mac(data) });
  }
}

/** `m1.<kid>.<base64url(HMAC-SHA256)>` under a key derived from the master key (HKDF-SHA256, info `kms/row-mac/v1`). */
function rowMac([kid, key]: [string, Buffer]): Mac {
  const macKey = Buffer.from(hkdfSync('sha256', key, Buffer.alloc(0), 'kms/row-mac/v1', 32));
  return (data) => `m1.${kid}.${createHmac('sha256', macKey).update(data).digest('base64url')}`;
}

/** The public development key: the master key where NODE_ENV is development or test and none is set. */
const DEV_MASTER_KEY = 'dev:' + Buffer.alloc(32, 'kms-development-master-key-000000').toString('base64');

/**
 * The master key of this process's environment, `kid:base64` (kid `k1` when absent). Rows this old
 * predate the keyring: their data key is MASTER_KEY itself (the keyring imports it later). Outside
 * development and test the key must be set and must not be the public development key.
 */
function environmentMasterKey(env: NodeJS.ProcessEnv = process.env): [string, Buffer] {
  const development = env.NODE_ENV === 'development' || env.NODE_ENV === 'test';
  const spec = env.MASTER_KEY ?? (development && !env.MASTER_KEY_URI ? DEV_MASTER_KEY : undefined);
  if (!spec) throw new Error('MASTER_KEY must be set to give the key rows from before row MACs their MACs');
  const at = spec.indexOf(':');
  const kid = at > 0 ? spec.slice(0, at) : 'k1';
  const key = Buffer.from(at > 0 ? spec.slice(at + 1) : spec, 'base64');
  if (!/^[A-Za-z0-9_-]{1,32}$/.test(kid)) throw new Error('master key id must be 1-32 characters of [A-Za-z0-9_-]');
  if (key.length !== 32) throw new Error(`master key "${kid}" must be 32 bytes, base64 encoded`);
  if (!development && key.equals(Buffer.from(DEV_MASTER_KEY.slice(4), 'base64')))
    throw new Error('the public development master key is not allowed in MASTER_KEY outside development and test');
  return [kid, key];
}
