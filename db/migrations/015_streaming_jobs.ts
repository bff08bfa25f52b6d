import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // A file job starts while its upload still arrives: the worker takes input n once its row exists and
  // knows there are no more when uploaded_at is set. Jobs from before were whole when they were queued.
  await knex.schema.alterTable('jobs', (t) => {
    t.timestamp('uploaded_at', { useTz: true });
  });
  await knex('jobs').update({ uploaded_at: knex.ref('created_at') });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('jobs', (t) => t.dropColumn('uploaded_at'));
}
