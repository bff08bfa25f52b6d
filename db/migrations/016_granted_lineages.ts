import type { Knex } from 'knex';

/**
 * The one definition of "granted" through team access (db/teams.ts grantedLineageIds) as a PL/pgSQL
 * function: a grant counts only while the link that made it still points at the same source, the source
 * still owns the lineage, and both are members of the same organization.
 *
 * Why a function: as a subquery its five-way join was planned again inside every statement that checks
 * key ownership (listing keys, resolving a fingerprint for a job), ~1.5 ms of Postgres CPU each against
 * ~0.1 ms to run it. PL/pgSQL keeps the plan of its query for the session, and the statements that call it
 * plan in ~0.2 ms.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE FUNCTION granted_lineage_ids(grantee uuid) RETURNS SETOF uuid
    LANGUAGE plpgsql STABLE ROWS 10 AS $$
    BEGIN
      RETURN QUERY
        SELECT g.lineage_id FROM team_grants g
        JOIN team_links tl ON tl.grantee_id = g.grantee_id AND tl.source_id = g.source_id
        JOIN key_lineages gl ON gl.id = g.lineage_id AND gl.user_id = g.source_id
        JOIN organization_members mg ON mg.user_id = g.grantee_id
        JOIN organization_members ms ON ms.user_id = g.source_id AND ms.organization_id = mg.organization_id
        WHERE g.grantee_id = grantee;
    END $$`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP FUNCTION granted_lineage_ids(uuid)');
}
