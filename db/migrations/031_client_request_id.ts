import type { Knex } from 'knex';

/**
 * An audit row keeps the client's own X-Request-Id beside the service's request id, only in the form the
 * API accepts one (api/middleware/request-context.ts): a short id of plain characters, never free text.
 * It is part of the row's content digest when set (lib/audit-chain.ts), so rows written before keep the
 * digest they have. The check is NOT VALID because every existing row has no value: new rows are checked
 * without a scan of the table under the column's lock.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw('ALTER TABLE audit_logs ADD COLUMN client_request_id text');
  await knex.raw(`ALTER TABLE audit_logs ADD CONSTRAINT audit_logs_client_request_id_form CHECK (client_request_id ~ '^[A-Za-z0-9._:-]{1,64}$') NOT VALID`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('ALTER TABLE audit_logs DROP COLUMN client_request_id');
}
