import type { Knex } from 'knex';

/**
 * The chain's link (audit_logs_chain, migration 023) finds its row by primary key and its head by the
 * chain's key: single rows, for which an index is right at every table size. PL/pgSQL caches a session's
 * plan, and one made while audit_logs was a page or two is a sequential scan, which then reads the whole
 * table for every row linked until something invalidates it (an ANALYZE; never, without autovacuum).
 * With sequential scans off inside the function, its cached plans use the indexes whatever the table held
 * when they were made.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw('ALTER FUNCTION audit_logs_chain() SET enable_seqscan = off');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('ALTER FUNCTION audit_logs_chain() RESET enable_seqscan');
}
