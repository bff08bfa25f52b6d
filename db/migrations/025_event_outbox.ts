import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // Account events wait here until they are in the account's Redis stream: a change whose event could not
  // be published (Redis down) still has it told, in order, once Redis is back.
  await knex.schema.createTable('event_outbox', (t) => {
    t.bigIncrements('id');
    t.uuid('user_id').notNullable();
    t.text('type').notNullable();
    t.jsonb('data').notNullable();
    // Publish only if this Redis key is new (see lib/events.ts `Once`); null: the row's own id.
    t.text('once_key').unique();
    t.integer('once_seconds');
    t.timestamp('created_at', { useTz: true }).notNullable();
    t.index(['user_id', 'id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('event_outbox');
}
