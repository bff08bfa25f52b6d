import type { Knex } from 'knex';

export async function up(knex: Knex): Promise<void> {
  // WebAuthn credentials (passkeys). The public key is what an assertion is verified with; the
  // signature counter is kept to spot a cloned authenticator; nothing here is secret.
  await knex.schema.createTable('passkeys', (t) => {
    t.uuid('id').primary().defaultTo(knex.raw('gen_random_uuid()'));
    t.uuid('user_id').notNullable().references('users.id').onDelete('CASCADE');
    // The authenticator's credential id, base64url, as browsers send it back.
    t.text('credential_id').notNullable().unique();
    // COSE_Key bytes from the attestation.
    t.binary('public_key').notNullable();
    // Unsigned 32-bit in WebAuthn: bigint holds all of it.
    t.bigInteger('counter').notNullable().defaultTo(0);
    t.specificType('transports', 'text[]').notNullable().defaultTo('{}');
    t.text('device_type').notNullable(); // singleDevice | multiDevice
    t.boolean('backed_up').notNullable().defaultTo(false);
    t.text('aaguid').notNullable();
    t.text('name').notNullable();
    t.boolean('active').notNullable().defaultTo(true);
    t.timestamp('last_used_at', { useTz: true });
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['user_id', 'created_at']);
  });
  await knex.raw(`ALTER TABLE passkeys ADD CONSTRAINT passkeys_device_type_check CHECK (device_type IN ('singleDevice', 'multiDevice'))`);
  await knex.raw('ALTER TABLE passkeys ADD CONSTRAINT passkeys_counter_check CHECK (counter BETWEEN 0 AND 4294967295)');
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('passkeys');
}
