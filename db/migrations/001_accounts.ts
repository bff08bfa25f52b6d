import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('users', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.text('username').notNullable();
    t.text('email').notNullable();
    t.text('company_name');
    t.text('password_hash').notNullable();
    t.text('role').notNullable().defaultTo('user');
    // Bumped by password change, reset and deletion: every JWT carries it, so older tokens stop working.
    t.integer('token_version').notNullable().defaultTo(0);
    t.integer('rotation_days');
    t.timestamp('deleted_at', { useTz: true });
    t.timestamps(true, true);
  });
  await knex.raw(`ALTER TABLE users ADD CONSTRAINT users_role_check CHECK (role IN ('user', 'admin'))`);
  await knex.raw(`ALTER TABLE users ADD CONSTRAINT users_rotation_days_check CHECK (rotation_days BETWEEN 1 AND 730)`);
  await knex.raw('CREATE UNIQUE INDEX users_username_unique ON users (lower(username))');
  await knex.raw('CREATE UNIQUE INDEX users_email_unique ON users (lower(email))');

  await knex.schema.createTable('partner_api_keys', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    t.text('prefix').notNullable();
    t.text('key_hash').notNullable().unique();
    t.text('status').notNullable().defaultTo('active');
    t.timestamp('expires_at', { useTz: true }).notNullable();
    t.timestamp('last_used_at', { useTz: true });
    t.timestamp('revoked_at', { useTz: true });
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
  await knex.raw(`ALTER TABLE partner_api_keys ADD CONSTRAINT partner_api_keys_status_check CHECK (status IN ('active', 'rotated', 'revoked'))`);
  // One current partner key per account, enforced by the database so concurrent rotations cannot fork it.
  await knex.raw(`CREATE UNIQUE INDEX partner_api_keys_one_active ON partner_api_keys (user_id) WHERE status = 'active'`);

  await knex.schema.createTable('password_resets', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    t.text('token_hash').notNullable().unique();
    t.timestamp('expires_at', { useTz: true }).notNullable();
    t.timestamp('used_at', { useTz: true });
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['user_id']);
  });

  await knex.schema.createTable('audit_logs', (t) => {
    t.bigIncrements('id');
    t.uuid('user_id').references('users.id').onDelete('SET NULL');
    t.text('action').notNullable();
    t.text('status').notNullable();
    t.text('target');
    t.text('ip');
    t.text('request_id');
    t.jsonb('details').notNullable().defaultTo('{}');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['user_id', 'created_at']);
    t.index(['user_id', 'action']);
  });
  await knex.raw(`ALTER TABLE audit_logs ADD CONSTRAINT audit_logs_status_check CHECK (status IN ('success', 'failure'))`);

  await knex.schema.createTable('contact_requests', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.uuid('user_id').references('users.id').onDelete('SET NULL');
    t.text('name').notNullable();
    t.text('email').notNullable();
    t.text('subject').notNullable();
    t.text('message').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
}

export async function down(knex: Knex): Promise<void> {
  for (const table of ['contact_requests', 'audit_logs', 'password_resets', 'partner_api_keys', 'users']) {
    await knex.schema.dropTableIfExists(table);
  }
}
