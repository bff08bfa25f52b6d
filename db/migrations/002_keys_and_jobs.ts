import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // A lineage is "the key" as a user sees it: a label, an environment, and the passphrase-protected
  // unlock key pair that every generation's secret is sealed to (DESIGN.md, "Keys and secrets").
  await knex.schema.createTable('key_lineages', (t) => {
    t.uuid('id').primary();
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    t.text('label').notNullable();
    t.text('environment').notNullable();
    t.text('uid_name').notNullable();
    t.text('uid_email').notNullable();
    t.text('algorithm').notNullable();
    t.text('unlock_public').notNullable();
    // argon2id(passphrase)-encrypted X25519 private key, sealed again under the master key.
    t.text('unlock_locked').notNullable();
    // Lifetime given at creation; each new generation (rotation) gets the same lifetime from its birth.
    t.integer('key_ttl_days');
    t.timestamp('disabled_at', { useTz: true });
    t.integer('rotation_interval_days');
    t.timestamps(true, true);
    t.index(['user_id', 'environment', 'label']);
  });

  await knex.schema.createTable('pgp_keys', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.uuid('lineage_id').notNullable().references('key_lineages.id').onDelete('CASCADE');
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    t.integer('generation').notNullable();
    t.text('fingerprint').notNullable().unique();
    t.specificType('encryption_key_ids', 'text[]').notNullable();
    t.text('algorithm').notNullable();
    t.text('public_armored').notNullable();
    // The armored private key (locked with a random secret) and that secret (sealed to the lineage's
    // unlock key), each sealed again under the master key.
    t.text('private_sealed').notNullable();
    t.text('secret_sealed').notNullable();
    t.text('status').notNullable().defaultTo('active');
    t.timestamp('expires_at', { useTz: true });
    t.timestamp('rotated_at', { useTz: true });
    t.bigInteger('ops_count').notNullable().defaultTo(0);
    t.bigInteger('bytes_count').notNullable().defaultTo(0);
    t.timestamp('last_used_at', { useTz: true });
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.unique(['lineage_id', 'generation']);
  });
  await knex.raw(`ALTER TABLE pgp_keys ADD CONSTRAINT pgp_keys_status_check CHECK (status IN ('active', 'rotated'))`);
  // Exactly one current generation per lineage: encryption always goes to it.
  await knex.raw(`CREATE UNIQUE INDEX pgp_keys_one_current ON pgp_keys (lineage_id) WHERE status = 'active'`);
  await knex.raw('CREATE INDEX pgp_keys_encryption_key_ids ON pgp_keys USING gin (encryption_key_ids)');

  // Durable record of user-visible jobs (BullMQ holds the work; this holds what the client polls).
  await knex.schema.createTable('jobs', (t) => {
    t.uuid('id').primary();
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    t.text('kind').notNullable();
    t.text('state').notNullable().defaultTo('queued');
    t.jsonb('request').notNullable().defaultTo('{}');
    t.jsonb('progress').notNullable().defaultTo('{}');
    t.jsonb('result');
    t.jsonb('error');
    t.text('idempotency_key');
    t.integer('attempts').notNullable().defaultTo(0);
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('started_at', { useTz: true });
    t.timestamp('finished_at', { useTz: true });
    t.timestamp('expires_at', { useTz: true });
    t.timestamp('purged_at', { useTz: true });
    t.index(['user_id', 'created_at']);
  });
  await knex.raw(`ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('queued', 'active', 'completed', 'failed'))`);
  await knex.raw('CREATE UNIQUE INDEX jobs_idempotency ON jobs (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL');
  await knex.raw(`CREATE INDEX jobs_expiring ON jobs (expires_at) WHERE purged_at IS NULL`);

  await knex.schema.createTable('job_files', (t) => {
    t.uuid('job_id').notNullable().references('jobs.id').onDelete('CASCADE');
    t.text('role').notNullable();
    t.integer('n').notNullable();
    t.text('name').notNullable();
    t.bigInteger('size').notNullable();
    t.text('content_type').notNullable();
    t.primary(['job_id', 'role', 'n']);
  });
  await knex.raw(`ALTER TABLE job_files ADD CONSTRAINT job_files_role_check CHECK (role IN ('input', 'output'))`);
}

export async function down(knex: Knex): Promise<void> {
  for (const table of ['job_files', 'jobs', 'pgp_keys', 'key_lineages']) await knex.schema.dropTableIfExists(table);
}
