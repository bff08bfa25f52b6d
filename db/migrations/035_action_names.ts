import type { Knex } from 'knex';

/**
 * Audit actions and event types take one scheme (lib/event-names.ts, docs/events-and-webhooks.md).
 *
 * Audit rows keep their chain: a row's digest covers the action as it was written, so a renamed row
 * keeps that name in `recorded_action` and the export and both verifiers hash `coalesce(recorded_action,
 * action)` (db/audit-evidence.ts). `digest`, `hash` and every signed checkpoint stay exactly as they were;
 * the audit_logs triggers run on INSERT only. Webhook endpoints' event filters and events waiting in the
 * outbox take the new names (events already in a stream keep theirs).
 *
 * The names are copied here, not imported, so that what this migration does never changes with later code.
 */

const ACTIONS: [string, string][] = [
  ['account.delete', 'accounts.delete'],
  ['api_key.access_denied', 'api_keys.deny_access'],
  ['api_key.created', 'api_keys.create'],
  ['api_key.revoked', 'api_keys.revoke'],
  ['api_key.rotated', 'api_keys.rotate'],
  ['api_key.shared_value_read', 'api_key_shares.read_value'],
  ['api_key.value_read', 'api_keys.read_value'],
  ['api_key_share.access_denied', 'api_key_shares.deny_access'],
  ['api_key_share.created', 'api_key_shares.create'],
  ['api_key_share.revoked', 'api_key_shares.revoke'],
  ['auth.denied', 'sessions.deny'],
  ['auth.forgot_password', 'passwords.request_reset'],
  ['auth.login', 'sessions.login'],
  ['auth.logout', 'sessions.logout'],
  ['auth.reset_password', 'passwords.reset'],
  ['billing.checkout_created', 'billing_checkouts.create'],
  ['billing.customer_created', 'billing_customers.create'],
  ['billing.payment_failed', 'billing_payments.fail'],
  ['billing.plan_changed', 'billing_plans.change'],
  ['billing.portal_opened', 'billing_portals.open'],
  ['billing.status_changed', 'billing_subscriptions.change_status'],
  ['contact.submit', 'contact_requests.submit'],
  ['job.access_denied', 'jobs.deny_access'],
  ['key.access_denied', 'keys.deny_access'],
  ['key.passphrase_failed', 'keys.check_passphrase'],
  ['key_share.access_denied', 'key_shares.deny_access'],
  ['key_share.created', 'key_shares.create'],
  ['key_share.revoked', 'key_shares.revoke'],
  ['keys.destruction_cancel', 'keys.cancel_destruction'],
  ['keys.destruction_schedule', 'keys.schedule_destruction'],
  ['keys.expiry_warning', 'keys.warn_expiry'],
  ['keys.generation_destroy', 'keys.destroy_generation'],
  ['keys.rotation_schedule', 'keys.schedule_rotation'],
  ['keys.settings_update', 'keys.update_settings'],
  ['keys.token_key_delete', 'keys.delete_token_key'],
  ['master_key.init', 'master_keys.init'],
  ['master_key.reseal', 'master_keys.reseal'],
  ['master_key.retire', 'master_keys.retire'],
  ['master_key.rewrap', 'master_keys.rewrap'],
  ['master_key.rotate', 'master_keys.rotate'],
  ['master_key.status', 'master_keys.status'],
  ['organization.created', 'organizations.create'],
  ['organization.invitation_accept', 'organization_invitations.accept'],
  ['organization.invitation_created', 'organization_invitations.create'],
  ['organization.invitation_reopened', 'organization_invitations.reopen'],
  ['organization.invitation_revoked', 'organization_invitations.revoke'],
  ['organization.member_joined', 'organization_members.join'],
  ['organization.member_removed', 'organization_members.remove'],
  ['organization.owner_changed', 'organizations.change_owner'],
  ['organization.role_changed', 'organization_members.change_role'],
  ['organization_invitation.access_denied', 'organization_invitations.deny_access'],
  ['organization_member.access_denied', 'organization_members.deny_access'],
  ['partner.register', 'partners.register'],
  ['partner.rotate_api_key', 'partners.rotate_api_key'],
  ['passkey.access_denied', 'passkeys.deny_access'],
  ['passkey.add', 'passkeys.add'],
  ['passkey.clone_suspected', 'passkeys.suspect_clone'],
  ['passkey.remove', 'passkeys.remove'],
  ['passkey.update', 'passkeys.update'],
  ['profile.change_email', 'profiles.change_email'],
  ['profile.change_password', 'passwords.change'],
  ['profile.update', 'profiles.update'],
  ['profile.update_rotation_days', 'profiles.update_rotation_days'],
  ['recovery_review.kept', 'recovery_review_items.keep'],
  ['recovery_review.removed', 'recovery_review_items.remove'],
  ['recovery_review_item.access_denied', 'recovery_review_items.deny_access'],
  ['system.restore', 'backups.restore'],
  ['team_access.approval_withdrawn', 'team_links.withdraw_approval'],
  ['team_access.approved', 'team_links.approve'],
  ['team_access.ended', 'team_links.end'],
  ['team_access.linked', 'team_links.link'],
  ['team_access.requested', 'team_links.request'],
  ['team_access.synced', 'team_links.sync'],
  ['team_access.unlinked', 'team_links.unlink'],
  ['team_link.access_denied', 'team_links.deny_access'],
  ['team_member.access_denied', 'team_members.deny_access'],
  ['user.demote', 'users.demote'],
  ['user.promote', 'users.promote'],
  ['webhook.access_denied', 'webhooks.deny_access'],
  ['webhook.created', 'webhooks.create'],
  ['webhook.deleted', 'webhooks.delete'],
  ['webhook.disabled', 'webhooks.disable'],
  ['webhook.redelivered', 'webhook_deliveries.redeliver'],
  ['webhook.secret_rotated', 'webhooks.rotate_secret'],
  ['webhook.test_sent', 'webhooks.send_test'],
  ['webhook.updated', 'webhooks.update'],
  ['webhook_delivery.access_denied', 'webhook_deliveries.deny_access'],
];

const EVENT_TYPES: [string, string][] = [
  ['key.generated', 'keys.generated'],
  ['key.disabled', 'keys.disabled'],
  ['key.rotated', 'keys.rotated'],
  ['key.rotation_failed', 'keys.rotation_failed'],
  ['key.expiring', 'keys.expiry_warned'],
  ['key.expired', 'keys.expired'],
  ['key.destruction_scheduled', 'keys.destruction_scheduled'],
  ['key.destruction_cancelled', 'keys.destruction_cancelled'],
  ['key.generation_destroyed', 'keys.generation_destroyed'],
  ['key.passphrase_failed', 'keys.passphrase_failed'],
  ['key.imported', 'keys.imported'],
  ['key.signed', 'keys.signed'],
  ['key.verified', 'keys.verified'],
  ['job.completed', 'jobs.completed'],
  ['job.failed', 'jobs.failed'],
  ['audit.recorded', 'audit_logs.recorded'],
  ['audit.checkpoint', 'audit_checkpoints.signed'],
  ['audit.chain_broken', 'audit_chains.broken'],
  ['share.created', 'share_links.created'],
  ['share.revoked', 'share_links.revoked'],
  ['share.viewed', 'share_links.viewed'],
  ['api_key.created', 'api_keys.created'],
  ['api_key.rotated', 'api_keys.rotated'],
  ['api_key.revoked', 'api_keys.revoked'],
  ['passkey.added', 'passkeys.added'],
  ['passkey.removed', 'passkeys.removed'],
  ['billing.plan_changed', 'billing_plans.changed'],
  ['billing.payment_failed', 'billing_payments.failed'],
  ['team_access.linked', 'team_links.linked'],
  ['team_access.synced', 'team_links.synced'],
  ['team_access.unlinked', 'team_links.unlinked'],
  ['team_access.requested', 'team_links.requested'],
  ['team_access.approved', 'team_links.approved'],
  ['organization.member_joined', 'organization_members.joined'],
  ['organization.member_removed', 'organization_members.removed'],
];

const pairs = (list: [string, string][]) => JSON.stringify(list.map(([old, now]) => ({ old, now })));

export async function up(knex: Knex): Promise<void> {
  await knex.raw('ALTER TABLE audit_logs ADD COLUMN recorded_action text');
  await knex.raw(
    `UPDATE audit_logs a SET recorded_action = a.action, action = v.now
       FROM jsonb_to_recordset(?::jsonb) AS v(old text, now text) WHERE a.action = v.old`,
    [pairs(ACTIONS)],
  );
  await knex.raw(
    `UPDATE webhook_endpoints w SET event_types = (
         SELECT coalesce(array_agg(DISTINCT coalesce(v.now, t)), '{}') FROM unnest(w.event_types) AS t
           LEFT JOIN jsonb_to_recordset(?::jsonb) AS v(old text, now text) ON v.old = t)
      WHERE w.event_types && ?::text[]`,
    [pairs(EVENT_TYPES), EVENT_TYPES.map(([old]) => old)],
  );
  await knex.raw(`UPDATE event_outbox o SET type = v.now FROM jsonb_to_recordset(?::jsonb) AS v(old text, now text) WHERE o.type = v.old`, [
    pairs(EVENT_TYPES),
  ]);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('UPDATE audit_logs SET action = recorded_action WHERE recorded_action IS NOT NULL');
  await knex.raw('ALTER TABLE audit_logs DROP COLUMN recorded_action');
  const back = JSON.stringify(EVENT_TYPES.map(([old, now]) => ({ old: now, now: old })));
  await knex.raw(
    `UPDATE webhook_endpoints w SET event_types = (
         SELECT coalesce(array_agg(DISTINCT coalesce(v.now, t)), '{}') FROM unnest(w.event_types) AS t
           LEFT JOIN jsonb_to_recordset(?::jsonb) AS v(old text, now text) ON v.old = t)`,
    [back],
  );
  await knex.raw(`UPDATE event_outbox o SET type = v.now FROM jsonb_to_recordset(?::jsonb) AS v(old text, now text) WHERE o.type = v.old`, [back]);
}
