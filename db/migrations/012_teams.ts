import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // Every account belongs to exactly one organization (organization_members.user_id is the key). An
  // account starts as the owner of its own one-member organization: made here for existing accounts,
  // and on first use for accounts registered later (lib/teams/organizations.ts ensureMembership).
  await knex.schema.createTable('organizations', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.text('name').notNullable();
    // The owning (partner) account; null only while no live member is left to take it over.
    t.uuid('owner_id').references('users.id').onDelete('SET NULL');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
  await knex.schema.createTable('organization_members', (t) => {
    t.uuid('user_id').primary().references('users.id').onDelete('CASCADE');
    t.uuid('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('role').notNullable();
    t.timestamp('joined_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['organization_id', 'joined_at']);
  });
  await knex.raw(`ALTER TABLE organization_members ADD CONSTRAINT organization_members_role_check CHECK (role IN ('owner', 'admin', 'member'))`);
  // One owner per organization, held by the database.
  await knex.raw(`CREATE UNIQUE INDEX organization_members_one_owner ON organization_members (organization_id) WHERE role = 'owner'`);

  // Invitations: the token (256 bits) is mailed and only its SHA-256 is stored; single use, expiring.
  await knex.schema.createTable('organization_invitations', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.uuid('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('email').notNullable();
    t.text('role').notNullable();
    t.uuid('invited_by').references('users.id').onDelete('SET NULL');
    t.text('token_hash').notNullable().unique();
    t.timestamp('expires_at', { useTz: true }).notNullable();
    t.timestamp('accepted_at', { useTz: true });
    t.uuid('accepted_by').references('users.id').onDelete('SET NULL');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['organization_id', 'created_at']);
  });
  await knex.raw(`ALTER TABLE organization_invitations ADD CONSTRAINT organization_invitations_role_check CHECK (role IN ('admin', 'member'))`);

  // Team access: one link per account to the source member whose keys it inherits.
  await knex.schema.createTable('team_links', (t) => {
    t.uuid('grantee_id').primary().references('users.id').onDelete('CASCADE');
    t.uuid('source_id').notNullable().references('users.id').onDelete('CASCADE');
    t.text('state').notNullable().defaultTo('pending');
    t.text('last_error');
    t.timestamp('linked_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('last_synced_at', { useTz: true });
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['source_id']);
  });
  await knex.raw(`ALTER TABLE team_links ADD CONSTRAINT team_links_state_check CHECK (state IN ('pending', 'running', 'ok', 'failed'))`);
  await knex.raw('ALTER TABLE team_links ADD CONSTRAINT team_links_not_self CHECK (grantee_id <> source_id)');

  // What the team-sync job computed: the grantee may use these lineages of the source (one hop).
  await knex.schema.createTable('team_grants', (t) => {
    t.uuid('grantee_id').notNullable().references('users.id').onDelete('CASCADE');
    t.uuid('lineage_id').notNullable().references('key_lineages.id').onDelete('CASCADE');
    t.uuid('source_id').notNullable().references('users.id').onDelete('CASCADE');
    t.timestamp('granted_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.primary(['grantee_id', 'lineage_id']);
    t.index(['lineage_id']);
    t.index(['source_id']);
  });

  // Existing accounts: each gets its own organization, named after its company (or username), as owner.
  await knex.raw(`
    WITH made AS (
      INSERT INTO organizations (name, owner_id)
      SELECT coalesce(nullif(company_name, ''), username), id FROM users WHERE deleted_at IS NULL
      RETURNING id, owner_id
    )
    INSERT INTO organization_members (user_id, organization_id, role) SELECT owner_id, id, 'owner' FROM made
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('team_grants');
  await knex.schema.dropTableIfExists('team_links');
  await knex.schema.dropTableIfExists('organization_invitations');
  await knex.schema.dropTableIfExists('organization_members');
  await knex.schema.dropTableIfExists('organizations');
}
