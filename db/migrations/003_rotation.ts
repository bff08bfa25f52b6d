import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // A key's own rotation setting: 'policy' follows the account's rotation_days, 'interval' uses
  // rotation_interval_days, 'off' never rotates on a schedule (manual rotation still works).
  await knex.schema.alterTable('key_lineages', (t) => {
    t.text('rotation_mode').notNullable().defaultTo('policy');
  });
  await knex.raw(`ALTER TABLE key_lineages ADD CONSTRAINT key_lineages_rotation_mode_check CHECK (rotation_mode IN ('policy', 'interval', 'off'))`);
  await knex.raw(
    `ALTER TABLE key_lineages ADD CONSTRAINT key_lineages_interval_check CHECK ((rotation_mode = 'interval') = (rotation_interval_days IS NOT NULL))`,
  );

  await knex.schema.alterTable('pgp_keys', (t) => {
    t.timestamp('expiry_warned_at', { useTz: true });
  });

  await knex.schema.createTable('rotation_history', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    t.uuid('lineage_id').notNullable().references('key_lineages.id').onDelete('CASCADE');
    t.text('old_fingerprint').notNullable();
    t.text('new_fingerprint');
    t.integer('from_generation').notNullable();
    t.text('trigger').notNullable();
    t.uuid('actor_id');
    t.text('status').notNullable();
    t.jsonb('error');
    t.uuid('job_id');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['user_id', 'created_at']);
    t.index(['lineage_id', 'created_at']);
  });
  await knex.raw(`ALTER TABLE rotation_history ADD CONSTRAINT rotation_history_trigger_check CHECK (trigger IN ('manual', 'schedule', 'policy'))`);
  await knex.raw(`ALTER TABLE rotation_history ADD CONSTRAINT rotation_history_status_check CHECK (status IN ('succeeded', 'failed'))`);
  // A generation is rotated away from once: retries, racing schedulers and crashes cannot double it.
  await knex.raw(`CREATE UNIQUE INDEX rotation_history_once ON rotation_history (lineage_id, from_generation) WHERE status = 'succeeded'`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('rotation_history');
  await knex.schema.alterTable('pgp_keys', (t) => t.dropColumn('expiry_warned_at'));
  await knex.raw('ALTER TABLE key_lineages DROP CONSTRAINT key_lineages_interval_check');
  await knex.schema.alterTable('key_lineages', (t) => t.dropColumn('rotation_mode'));
}
