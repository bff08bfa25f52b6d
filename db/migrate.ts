import type { Knex } from 'knex';
import * as m001 from './migrations/001_accounts';
import * as m002 from './migrations/002_keys_and_jobs';
import * as m003 from './migrations/003_rotation';
import * as m004 from './migrations/004_account_hardening';
import * as m005 from './migrations/005_key_integrity';
import * as m006 from './migrations/006_job_request_hash';
import * as m007 from './migrations/007_webhooks';
import * as m008 from './migrations/008_key_shares';
import * as m009 from './migrations/009_passkeys';
import * as m010 from './migrations/010_api_keys';
import * as m011 from './migrations/011_billing';
import * as m012 from './migrations/012_teams';
import * as m013 from './migrations/013_api_key_usage';
import * as m014 from './migrations/014_key_lifecycle';
import * as m015 from './migrations/015_streaming_jobs';
import * as m016 from './migrations/016_granted_lineages';
import * as m017 from './migrations/017_job_data_keys';
import * as m019 from './migrations/019_team_link_approval';
import * as m020 from './migrations/020_unfinished_jobs';
import * as m021 from './migrations/021_signatures_and_import';
import * as m022 from './migrations/022_keyring';
import * as m023 from './migrations/023_audit_chain';
import * as m025 from './migrations/025_event_outbox';
import * as m026 from './migrations/026_lineage_token_keys';
import * as m027 from './migrations/027_audit_chain_plan';
import * as m028 from './migrations/028_recovery_review';
import * as m030 from './migrations/030_account_fingerprints';
import * as m031 from './migrations/031_client_request_id';
import * as m032 from './migrations/032_key_profiles';
import * as m033 from './migrations/033_share_token_sealed';
import * as m034 from './migrations/034_api_key_idempotency';
import * as m035 from './migrations/035_action_names';
import * as m037 from './migrations/037_jobs_hot_updates';

/**
 * Migrations are imported modules rather than files knex discovers, so they run the same under tsx,
 * vitest and any bundler. Append new ones here in order.
 */
const migrations: Record<string, Knex.Migration> = {
  '001_accounts': m001,
  '002_keys_and_jobs': m002,
  '003_rotation': m003,
  '004_account_hardening': m004,
  '005_key_integrity': m005,
  '006_job_request_hash': m006,
  '007_webhooks': m007,
  '008_key_shares': m008,
  '009_passkeys': m009,
  '010_api_keys': m010,
  '011_billing': m011,
  '012_teams': m012,
  '013_api_key_usage': m013,
  '014_key_lifecycle': m014,
  '015_streaming_jobs': m015,
  '016_granted_lineages': m016,
  '017_job_data_keys': m017,
  '019_team_link_approval': m019,
  '020_unfinished_jobs': m020,
  '021_signatures_and_import': m021,
  '022_keyring': m022,
  '023_audit_chain': m023,
  '025_event_outbox': m025,
  '026_lineage_token_keys': m026,
  '027_audit_chain_plan': m027,
  '028_recovery_review': m028,
  '030_account_fingerprints': m030,
  '031_client_request_id': m031,
  '032_key_profiles': m032,
  '033_share_token_sealed': m033,
  '034_api_key_idempotency': m034,
  '035_action_names': m035,
  '037_jobs_hot_updates': m037,
};

/** The migrations this version knows, in order (a restore refuses a database migrated further). */
export const knownMigrations = (): string[] => Object.keys(migrations);

const source: Knex.MigrationSource<string> = {
  getMigrations: async () => Object.keys(migrations),
  getMigrationName: (name) => name,
  getMigration: async (name) => migrations[name],
};

export async function migrateLatest(db: Knex): Promise<string[]> {
  const [, applied] = (await db.migrate.latest({ migrationSource: source })) as [number, string[]];
  return applied;
}

export async function migrateRollback(db: Knex): Promise<string[]> {
  const [, undone] = (await db.migrate.rollback({ migrationSource: source }, true)) as [number, string[]];
  return undone;
}
