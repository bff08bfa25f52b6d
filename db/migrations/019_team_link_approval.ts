import type { Knex } from 'knex';

/**
 * Team access links take effect only once approved (by the source member or an organization manager),
 * and organization invitations can be revoked.
 *
 * Links made before approvals existed were never consented to by their source: they start unapproved,
 * and grant nothing until the source (or a manager) approves them.
 */
const grantRule = (approved: boolean) => `
    CREATE OR REPLACE FUNCTION granted_lineage_ids(grantee uuid) RETURNS SETOF uuid
    LANGUAGE plpgsql STABLE ROWS 10 AS $$
    BEGIN
      RETURN QUERY
        SELECT g.lineage_id FROM team_grants g
        JOIN team_links tl ON tl.grantee_id = g.grantee_id AND tl.source_id = g.source_id${approved ? ' AND tl.approved_at IS NOT NULL' : ''}
        JOIN key_lineages gl ON gl.id = g.lineage_id AND gl.user_id = g.source_id
        JOIN organization_members mg ON mg.user_id = g.grantee_id
        JOIN organization_members ms ON ms.user_id = g.source_id AND ms.organization_id = mg.organization_id
        WHERE g.grantee_id = grantee;
    END $$`;

export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('team_links', (t) => {
    // Null while the link is only requested: it grants nothing.
    t.timestamp('approved_at', { useTz: true });
    t.uuid('approved_by').references('users.id').onDelete('SET NULL');
  });
  // One definition of "granted" (migration 016), now counting approved links only.
  await knex.raw(grantRule(true));

  await knex.schema.alterTable('organization_invitations', (t) => {
    t.timestamp('revoked_at', { useTz: true });
    t.uuid('revoked_by').references('users.id').onDelete('SET NULL');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('organization_invitations', (t) => {
    t.dropColumn('revoked_by');
    t.dropColumn('revoked_at');
  });
  await knex.raw(grantRule(false));
  await knex.schema.alterTable('team_links', (t) => {
    t.dropColumn('approved_by');
    t.dropColumn('approved_at');
  });
}
