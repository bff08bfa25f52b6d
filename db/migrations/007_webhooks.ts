import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // Outbound webhook subscriptions (Standard Webhooks). Secrets are sealed under the master key, bound
  // to the endpoint id; during a rotation the previous secret still signs until its grace ends.
  await knex.schema.createTable('webhook_endpoints', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    t.text('url').notNullable();
    t.text('description').notNullable().defaultTo('');
    // Empty: every event type.
    t.specificType('event_types', 'text[]').notNullable().defaultTo('{}');
    t.boolean('enabled').notNullable().defaultTo(true);
    // Why the service turned it off (`gone`: the receiver answered 410), null when a user did.
    t.text('disabled_reason');
    t.text('secret_sealed').notNullable();
    t.text('previous_secret_sealed');
    t.timestamp('previous_secret_expires_at', { useTz: true });
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['user_id']);
  });
  // One event (or test ping) for one endpoint; its id is the `webhook-id` every attempt carries.
  await knex.schema.createTable('webhook_deliveries', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.uuid('endpoint_id').notNullable().references('webhook_endpoints.id').onDelete('CASCADE');
    t.uuid('user_id').notNullable();
    t.text('event_id').notNullable();
    t.text('event_type').notNullable();
    // The exact body sent (the event envelope: ids and states, never secrets), so retries are byte-identical.
    t.text('body').notNullable();
    t.text('state').notNullable().defaultTo('pending'); // pending | succeeded | failed
    t.integer('attempts').notNullable().defaultTo(0);
    t.timestamp('next_attempt_at', { useTz: true });
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['endpoint_id', 'created_at']);
    t.index(['created_at']);
  });
  await knex.schema.createTable('webhook_attempts', (t) => {
    t.bigIncrements('id');
    t.uuid('delivery_id').notNullable().references('webhook_deliveries.id').onDelete('CASCADE');
    t.integer('status_code');
    t.integer('latency_ms').notNullable();
    // A short machine code (timeout, address_not_allowed, http_503, ...), never the receiver's text.
    t.text('error');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['delivery_id']);
  });
  // audit.recorded events: every committed audit row is announced to listeners (NOTIFY is delivered
  // at commit, never for a rolled-back row), whatever code path wrote it.
  await knex.raw(`
    CREATE FUNCTION audit_logs_notify() RETURNS trigger AS $$
    BEGIN
      IF NEW.user_id IS NOT NULL THEN
        PERFORM pg_notify('audit_recorded', json_build_object('id', NEW.id, 'user_id', NEW.user_id, 'action', NEW.action, 'status', NEW.status, 'target', left(NEW.target, 200), 'created_at', NEW.created_at)::text);
      END IF;
      RETURN NEW;
    END $$ LANGUAGE plpgsql;
    CREATE TRIGGER audit_logs_notify AFTER INSERT ON audit_logs FOR EACH ROW EXECUTE FUNCTION audit_logs_notify();
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP TRIGGER IF EXISTS audit_logs_notify ON audit_logs; DROP FUNCTION IF EXISTS audit_logs_notify();');
  await knex.schema.dropTableIfExists('webhook_attempts');
  await knex.schema.dropTableIfExists('webhook_deliveries');
  await knex.schema.dropTableIfExists('webhook_endpoints');
}
