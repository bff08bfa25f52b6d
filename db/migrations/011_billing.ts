import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // One row per account that has touched billing: its provider customer (created once: the unique
  // customer id and the row lock taken at checkout), and the subscription as last read from the provider.
  await knex.schema.createTable('billing_accounts', (t) => {
    t.uuid('user_id').primary().references('users.id').onDelete('CASCADE');
    t.text('customer_id').unique();
    t.text('subscription_id');
    // The plan the subscription buys (the default plan without one); what is enforced also depends on status.
    t.text('plan').notNullable().defaultTo('free');
    // The provider's subscription status (active, trialing, past_due, canceled, ...) or `none`.
    t.text('status').notNullable().defaultTo('none');
    t.timestamp('current_period_end', { useTz: true });
    t.boolean('cancel_at_period_end').notNullable().defaultTo(false);
    // Set when the subscription is first seen past due: the grace period runs from here.
    t.timestamp('past_due_since', { useTz: true });
    // When the subscription was last read from the provider.
    t.timestamp('synced_at', { useTz: true });
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
  // Inbound provider events, stored once by their id before they are answered; the `billing` queue
  // processes them. Only ids and the type are kept, never the payload (it carries names, emails, addresses):
  // the processor reads the subscription from the provider itself.
  await knex.schema.createTable('billing_events', (t) => {
    t.text('id').primary();
    t.text('type').notNullable();
    t.boolean('livemode').notNullable();
    t.timestamp('provider_created_at', { useTz: true }).notNullable();
    t.text('object_id');
    t.text('customer_id');
    t.text('subscription_id');
    t.uuid('user_id');
    t.timestamp('received_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('processed_at', { useTz: true });
    // applied, unchanged, ignored (unknown customer, no subscription, type not handled)
    t.text('outcome');
    t.index(['customer_id']);
  });
  // Plaintext bytes encrypted, one row per completed encrypt job (its id unique, written in the job's
  // commit transaction): a job is counted once whatever its retries and crashes.
  await knex.schema.createTable('billing_usage', (t) => {
    t.uuid('job_id').primary();
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    // Calendar month (UTC) of completion, `YYYY-MM`.
    t.text('period').notNullable();
    t.bigInteger('bytes').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['user_id', 'period']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('billing_usage');
  await knex.schema.dropTableIfExists('billing_events');
  await knex.schema.dropTableIfExists('billing_accounts');
}
