import { createHash } from 'node:crypto';
import type { Knex } from 'knex';

/**
 * Audit rows become a hash chain per account (docs/audit-evidence.md states the rule):
 *   digest = SHA-256(JCS({action, details, ip, request_id, status, target}))        (RFC 8785)
 *   hash   = SHA-256(JCS({chain, created_at, digest, prev_hash, sequence}))
 * where `chain` is the account id at write time (`system` for rows without one), `created_at` is the
 * row's time in UTC with microseconds (`2026-01-02T03:04:05.123456Z`), `prev_hash` the previous row's
 * hash (64 zeros for the first) and all hashes lowercase hex. The writer supplies the digest; the
 * trigger below links the row under a lock on its chain's head, in the writer's transaction.
 *
 * Everything this migration needs is written here, so that what it means never changes with later code.
 */

const GENESIS = '0'.repeat(64);
const BATCH = 1000;

/** RFC 8785 on a JSON value (as JSON.parse returns it): sorted keys (UTF-16 order), ECMAScript numbers. */
function jcs(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(jcs).join(',')}]`;
  const o = value as Record<string, unknown>;
  return `{${Object.keys(o)
    .sort()
    .map((k) => `${JSON.stringify(k)}:${jcs(o[k])}`)
    .join(',')}}`;
}

const sha256 = (text: string) => createHash('sha256').update(text, 'utf8').digest('hex');

interface OldRow {
  id: string;
  user_id: string | null;
  action: string;
  status: string;
  target: string | null;
  ip: string | null;
  request_id: string | null;
  details: Record<string, unknown>;
  created_at_text: string;
}

const UTC_MICROS = `'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'`;

export async function up(knex: Knex): Promise<void> {
  await knex.raw('LOCK TABLE audit_logs IN SHARE ROW EXCLUSIVE MODE');
  await knex.schema.alterTable('audit_logs', (t) => {
    t.text('chain');
    t.bigInteger('sequence');
    t.text('digest');
    t.text('prev_hash');
    t.text('hash');
  });
  await knex.schema.createTable('audit_chains', (t) => {
    t.text('chain').primary();
    t.bigInteger('sequence').notNullable();
    t.text('prev_hash').notNullable();
    t.text('hash').notNullable();
  });

  // Existing rows, in the order they were written.
  const heads = new Map<string, { sequence: number; hash: string }>();
  for (let after = '0'; ;) {
    const { rows } = await knex.raw<{ rows: OldRow[] }>(
      `SELECT id, user_id, action, status, target, ip, request_id, details, to_char(created_at AT TIME ZONE 'UTC', ${UTC_MICROS}) AS created_at_text
         FROM audit_logs WHERE id > ? ORDER BY id LIMIT ?`,
      [after, BATCH],
    );
    if (!rows.length) break;
    const links = rows.map((r) => {
      const chain = r.user_id ?? 'system';
      const head = heads.get(chain) ?? { sequence: 0, hash: GENESIS };
      const digest = sha256(jcs({ action: r.action, details: r.details, ip: r.ip, request_id: r.request_id, status: r.status, target: r.target }));
      const sequence = head.sequence + 1;
      const hash = sha256(jcs({ chain, created_at: r.created_at_text, digest, prev_hash: head.hash, sequence }));
      heads.set(chain, { sequence, hash });
      return { id: r.id, chain, sequence, digest, prev_hash: head.hash, hash };
    });
    await knex.raw(
      `UPDATE audit_logs a SET chain = v.chain, sequence = v.sequence, digest = v.digest, prev_hash = v.prev_hash, hash = v.hash
         FROM jsonb_to_recordset(?::jsonb) AS v(id bigint, chain text, sequence bigint, digest text, prev_hash text, hash text)
        WHERE a.id = v.id`,
      [JSON.stringify(links)],
    );
    after = rows[rows.length - 1].id;
  }
  const headRows = [...heads].map(([chain, h]) => ({ chain, sequence: h.sequence, hash: h.hash }));
  for (let i = 0; i < headRows.length; i += BATCH) {
    await knex.raw(
      `INSERT INTO audit_chains (chain, sequence, prev_hash, hash)
       SELECT v.chain, v.sequence, a.prev_hash, v.hash FROM jsonb_to_recordset(?::jsonb) AS v(chain text, sequence bigint, hash text)
         JOIN audit_logs a ON a.chain = v.chain AND a.sequence = v.sequence`,
      [JSON.stringify(headRows.slice(i, i + BATCH))],
    );
  }

  await knex.raw(`
    ALTER TABLE audit_logs ALTER COLUMN digest SET NOT NULL;
    CREATE UNIQUE INDEX audit_logs_chain_sequence ON audit_logs (chain, sequence);

    -- The link of one row: the JCS of an object whose values are all hex, a uuid, 'system', a timestamp
    -- or an integer, so that concatenation is its exact canonical form.
    CREATE FUNCTION audit_link(chain text, created_at timestamptz, digest text, prev_hash text, seq bigint) RETURNS text
      LANGUAGE sql IMMUTABLE STRICT AS $$
        SELECT encode(sha256(convert_to(
          '{"chain":"' || chain || '","created_at":"' || to_char(created_at AT TIME ZONE 'UTC', ${UTC_MICROS}) ||
          '","digest":"' || digest || '","prev_hash":"' || prev_hash || '","sequence":' || seq::text || '}', 'UTF8')), 'hex')
      $$;

    -- A row is written with its content digest only.
    CREATE FUNCTION audit_logs_digest() RETURNS trigger AS $$
    BEGIN
      IF NEW.digest IS NULL OR NEW.digest !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'audit row without a content digest' USING ERRCODE = '23514';
      END IF;
      NEW.chain := NULL; NEW.sequence := NULL; NEW.prev_hash := NULL; NEW.hash := NULL;
      RETURN NEW;
    END $$ LANGUAGE plpgsql;
    CREATE TRIGGER audit_logs_digest BEFORE INSERT ON audit_logs FOR EACH ROW EXECUTE FUNCTION audit_logs_digest();

    -- Links every new row to its chain's head when its transaction commits, in the order the rows were
    -- written. The head is the last lock the writer takes (every other lock of its transaction is held by
    -- then), so chaining adds no lock-order cycle with the change it records; it stays locked until the
    -- commit ends, so writers of one chain take turns (no fork), and a rolled-back row never gets a link.
    CREATE FUNCTION audit_logs_chain() RETURNS trigger AS $$
    DECLARE
      link record;
      chain_id text := COALESCE(NEW.user_id::text, 'system');
    BEGIN
      INSERT INTO audit_chains AS h (chain, sequence, prev_hash, hash)
        VALUES (chain_id, 1, '${GENESIS}', audit_link(chain_id, NEW.created_at, NEW.digest, '${GENESIS}', 1))
        ON CONFLICT (chain) DO UPDATE SET sequence = h.sequence + 1, prev_hash = h.hash, hash = audit_link(chain_id, NEW.created_at, NEW.digest, h.hash, h.sequence + 1)
        RETURNING h.sequence, h.prev_hash, h.hash INTO link;
      UPDATE audit_logs SET chain = chain_id, sequence = link.sequence, prev_hash = link.prev_hash, hash = link.hash WHERE id = NEW.id;
      RETURN NULL;
    END $$ LANGUAGE plpgsql;
    CREATE CONSTRAINT TRIGGER audit_logs_chain AFTER INSERT ON audit_logs DEFERRABLE INITIALLY DEFERRED
      FOR EACH ROW EXECUTE FUNCTION audit_logs_chain();
  `);

  await knex.schema.createTable('audit_signing_keys', (t) => {
    t.text('kid').primary();
    /** The public key as a JWK (OKP, Ed25519): published, kept after retirement for verification. */
    t.jsonb('public_jwk').notNullable();
    /** The private key (PKCS#8 DER), sealed under the master key with the kid as AAD. */
    t.text('private_sealed').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('retired_at', { useTz: true });
  });
  await knex.raw('CREATE UNIQUE INDEX audit_signing_keys_one_current ON audit_signing_keys ((true)) WHERE retired_at IS NULL');

  await knex.schema.createTable('audit_checkpoints', (t) => {
    t.bigIncrements('id');
    t.text('chain').notNullable();
    t.bigInteger('sequence').notNullable();
    t.text('hash').notNullable();
    t.timestamp('signed_at', { useTz: true }).notNullable();
    t.text('kid').notNullable();
    /** The compact JWS (EdDSA) over {chain, sequence, hash, signed_at}. */
    t.text('jws').notNullable();
    t.unique(['chain', 'sequence']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(
    'DROP TRIGGER IF EXISTS audit_logs_chain ON audit_logs; DROP FUNCTION IF EXISTS audit_logs_chain(); DROP TRIGGER IF EXISTS audit_logs_digest ON audit_logs; DROP FUNCTION IF EXISTS audit_logs_digest(); DROP FUNCTION IF EXISTS audit_link(text, timestamptz, text, text, bigint);',
  );
  await knex.schema.dropTableIfExists('audit_checkpoints');
  await knex.schema.dropTableIfExists('audit_signing_keys');
  await knex.schema.dropTableIfExists('audit_chains');
  await knex.raw('DROP INDEX IF EXISTS audit_logs_chain_sequence');
  await knex.schema.alterTable('audit_logs', (t) => {
    t.dropColumns('chain', 'sequence', 'digest', 'prev_hash', 'hash');
  });
}
