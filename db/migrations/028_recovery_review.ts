import type { Knex } from 'knex';

/**
 * What a password reset undid of the grants the account (or whoever held it) made in the last
 * RECOVERY_REVIEW_DAYS, one row per thing, for its owner to keep or remove (lib/accounts/recovery-review.ts).
 * `target_id` names the thing by its own id (an invitation, a webhook endpoint, a team link by its grantee,
 * a member); `details` holds what keeping it restores (ids and times, never secrets).
 */
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('recovery_review_items', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    t.text('kind').notNullable();
    t.uuid('target_id').notNullable();
    t.text('label').notNullable();
    t.text('action').notNullable();
    t.jsonb('details').notNullable().defaultTo('{}');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.text('decision');
    t.timestamp('decided_at', { useTz: true });
    t.index(['user_id', 'created_at']);
  });
  await knex.raw(`
    ALTER TABLE recovery_review_items
      ADD CONSTRAINT recovery_review_items_kind_check CHECK (kind IN ('invitation', 'team_link', 'webhook', 'member')),
      ADD CONSTRAINT recovery_review_items_action_check CHECK (action IN ('revoked', 'returned_to_pending', 'paused', 'demoted', 'listed')),
      ADD CONSTRAINT recovery_review_items_decision_check CHECK (decision IN ('kept', 'removed')),
      ADD CONSTRAINT recovery_review_items_decided CHECK ((decision IS NULL) = (decided_at IS NULL))
  `);
  // One open item per thing: a second reset before the owner decided does not list it twice.
  await knex.raw(`CREATE UNIQUE INDEX recovery_review_items_open ON recovery_review_items (user_id, kind, target_id) WHERE decision IS NULL`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('recovery_review_items');
}
