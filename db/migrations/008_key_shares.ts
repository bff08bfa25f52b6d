import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // Share links: a tokenized public link to one resource of an account. One table for every kind
  // (`public_key`: a key lineage; `api_key`: a managed API key), so expiry, view limits, revocation and
  // analytics work the same way for both. `target_id` has no foreign key because it names a row of a
  // different table per kind; the kind's service checks the target at every view.
  await knex.schema.createTable('share_links', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.text('kind').notNullable();
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    t.uuid('target_id').notNullable();
    // SHA-256 of the token (256 random bits): the token itself is answered once and never stored.
    t.text('token_hash').notNullable().unique();
    t.timestamp('expires_at', { useTz: true });
    t.integer('view_limit');
    t.integer('view_count').notNullable().defaultTo(0);
    t.timestamp('last_viewed_at', { useTz: true });
    t.timestamp('revoked_at', { useTz: true });
    // The recipient's address (personal data), sealed under the master key and bound to the row.
    t.text('recipient_sealed');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['user_id', 'kind', 'created_at']);
    t.index(['kind', 'target_id']);
  });
  await knex.raw(`ALTER TABLE share_links ADD CONSTRAINT share_links_kind_check CHECK (kind IN ('public_key', 'api_key'))`);
  // The view limit holds in the database too: no write, however it got there, counts past it.
  await knex.raw(
    `ALTER TABLE share_links ADD CONSTRAINT share_links_views_check CHECK (view_count >= 0 AND (view_limit IS NULL OR (view_limit >= 1 AND view_count <= view_limit)))`,
  );

  // One row per successful view, for analytics: when, and a coarse class of client. Never the address
  // or the raw User-Agent string.
  await knex.schema.createTable('share_link_views', (t) => {
    t.bigIncrements('id');
    t.uuid('share_id').notNullable().references('share_links.id').onDelete('CASCADE');
    t.timestamp('viewed_at', { useTz: true }).notNullable();
    t.text('ua_class').notNullable();
    t.index(['share_id', 'viewed_at']);
    t.index(['viewed_at']); // the retention purge
  });
  await knex.raw(`ALTER TABLE share_link_views ADD CONSTRAINT share_link_views_ua_check CHECK (ua_class IN ('browser', 'cli', 'library', 'bot', 'other'))`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('share_link_views');
  await knex.schema.dropTableIfExists('share_links');
}
