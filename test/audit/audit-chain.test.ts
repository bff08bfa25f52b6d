import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { compactVerify, createLocalJWKSet } from 'jose';
import { Webhook } from 'standardwebhooks';
import { registerUser, startTestService, withClockAhead, type ManualClockFollowingTime, type TestService } from '../support/service';
import { signedHeaders, startReceiver } from '../support/webhook-receiver';
import { recordAudit } from '../../db/audit';
import { EvidenceVerifier, GENESIS, linkHash, rowDigest, type ExportLine, type Jwk, type Verdict } from '../../lib/audit-chain';
import { checkpointChains, verifyChain } from '../../lib/audit/audit-evidence';
import { AUDIT_VERIFICATIONS_PER_HOUR } from '../../lib/auth/limiters';
import * as m023 from '../../db/migrations/023_audit_chain';
import type { AuditAction } from '../../lib/event-names';

/** Audit evidence: the chain per account, signed checkpoints, the export and both verifiers. */
let s: TestService;
beforeAll(async () => {
  s = await startTestService();
});
afterAll(async () => {
  await s?.stop();
});

type User = Awaited<ReturnType<typeof registerUser>>;

async function exportOf(token: string, from?: number): Promise<ExportLine[]> {
  const res = await fetch(`${s.url}/audit-logs/export${from ? `?from_sequence=${from}` : ''}`, { headers: { authorization: `Bearer ${token}` } });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toContain('application/x-ndjson');
  const text = await res.text();
  return text
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as ExportLine);
}

const jwks = async () => (await s.api('GET', '/audit-logs/keys')).body as { keys: Jwk[] };

/** The offline verdict (what `kms audit verify` runs) and the server's own. */
async function verdicts(u: User): Promise<{ offline: Verdict; server: Verdict }> {
  const verifier = new EvidenceVerifier(await jwks());
  for (const line of await exportOf(u.token)) if (!verifier.add(line)) break;
  const server = await s.api('GET', '/audit-logs/verify', { token: u.token });
  expect(server.status).toBe(200);
  return { offline: verifier.verdict(), server: server.body as Verdict };
}

/** An account with `n` audit rows of its own beyond those of registering. */
async function accountWithRows(n: number): Promise<User> {
  const u = await registerUser(s.api);
  for (let i = 0; i < n; i++)
    await recordAudit(s.c.db, {
      user_id: u.id,
      action: 'test.row' as AuditAction,
      status: 'success',
      target: `t${i}`,
      details: { i, nested: { b: [1, 2.5, 'x'], a: null } },
    });
  return u;
}

const rowsOf = (userId: string) => s.c.db('audit_logs').where({ chain: userId }).orderBy('sequence').select('id', 'sequence', 'prev_hash', 'hash');

describe('the chain', () => {
  it('links every row of an account in order, from the genesis hash, and the list shows sequence and hash', async () => {
    const u = await accountWithRows(5);
    const rows = await rowsOf(u.id);
    expect(rows.map((r) => r.sequence)).toEqual(rows.map((_, i) => i + 1));
    expect(rows[0]!.prev_hash).toBe(GENESIS);
    for (let i = 1; i < rows.length; i++) expect(rows[i]!.prev_hash).toBe(rows[i - 1]!.hash);

    const list = await s.api('GET', '/audit-logs?page_size=100', { token: u.token });
    expect(list.status).toBe(200);
    const newest = list.body.items[0];
    expect(newest).toMatchObject({ action: 'test.row', target: 't4', sequence: rows.length, hash: rows[rows.length - 1]!.hash });
    expect(Object.keys(newest).sort()).toEqual([
      'action',
      'audit_id',
      'client_request_id',
      'created_at',
      'details',
      'hash',
      'ip',
      'request_id',
      'sequence',
      'status',
      'target',
      'target_label',
    ]);

    const { offline, server } = await verdicts(u);
    expect(offline).toMatchObject({ ok: true, rows: rows.length, checkpoints: 0, unanchored_rows: rows.length, first_break: null });
    expect(server).toEqual(offline);
  });

  it('puts rows without an account on the system chain', async () => {
    const before = (await s.c.db('audit_chains').where({ chain: 'system' }).first('sequence'))?.sequence ?? 0;
    await recordAudit(s.c.db, { user_id: null, action: 'test.system' as AuditAction, status: 'success' });
    const row = await s.c.db('audit_logs').where({ action: 'test.system' }).first();
    expect(row).toMatchObject({ chain: 'system', sequence: before + 1 });
    expect((await verifyChain(s.c, 'system')).ok).toBe(true);
  });

  it('gives 50 concurrent audited requests of one account one unbroken chain', async () => {
    const owner = await registerUser(s.api);
    const eve = await registerUser(s.api);
    const hook = await s.api('POST', '/webhooks', { token: owner.token, body: { url: 'http://127.0.0.1:9/a', event_types: ['keys.expired'] } });
    const before = (await rowsOf(eve.id)).length;
    const answers = await Promise.all(Array.from({ length: 50 }, () => s.api('GET', `/webhooks/${hook.body.webhook_id}`, { token: eve.token })));
    expect(answers.every((a) => a.status === 404)).toBe(true);
    // And writers that hold the chain inside longer transactions, interleaved with them.
    await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        s.c.db.transaction(async (trx) => {
          await recordAudit(trx, { user_id: eve.id, action: 'test.first' as AuditAction, status: 'success', target: String(i) });
          await new Promise((r) => setTimeout(r, Math.random() * 5));
          await recordAudit(trx, { user_id: eve.id, action: 'test.second' as AuditAction, status: 'success', target: String(i) });
        }),
      ),
    );
    const rows = await rowsOf(eve.id);
    expect(rows.length).toBe(before + 50 + 40);
    expect(rows.map((r) => r.sequence)).toEqual(rows.map((_, i) => i + 1));
    const { offline, server } = await verdicts(eve);
    expect(offline.ok && server.ok).toBe(true);
    // Both rows of one transaction are neighbours: the head stays locked until the transaction ends.
    const seconds = await s.c
      .db('audit_logs')
      .where({ chain: eve.id })
      .whereIn('action', ['test.first', 'test.second'])
      .orderBy('sequence')
      .select('action', 'target');
    for (let i = 0; i < seconds.length; i += 2)
      expect([seconds[i], seconds[i + 1]]).toEqual([
        { action: 'test.first', target: seconds[i]!.target },
        { action: 'test.second', target: seconds[i]!.target },
      ]);
  });

  it('leaves no link behind a rolled-back change', async () => {
    const u = await accountWithRows(2);
    const head = await s.c.db('audit_chains').where({ chain: u.id }).first();
    await expect(
      s.c.db.transaction(async (trx) => {
        await recordAudit(trx, { user_id: u.id, action: 'test.rolled_back' as AuditAction, status: 'success' });
        throw new Error('the change fails');
      }),
    ).rejects.toThrow('the change fails');
    expect(await s.c.db('audit_chains').where({ chain: u.id }).first()).toEqual(head);
    await recordAudit(s.c.db, { user_id: u.id, action: 'test.after' as AuditAction, status: 'success' });
    const rows = await rowsOf(u.id);
    expect(rows[rows.length - 1]).toMatchObject({ sequence: head.sequence + 1, prev_hash: head.hash });
    expect(await s.c.db('audit_logs').where({ action: 'test.rolled_back' })).toEqual([]);
    expect((await verdicts(u)).offline.ok).toBe(true);
  });

  it('links with index plans whatever size the table had when a session first planned the link (migration 027)', async () => {
    const { rows } = await s.c.db.raw<{ rows: { proconfig: string[] | null }[] }>(`SELECT proconfig FROM pg_proc WHERE proname = 'audit_logs_chain'`);
    expect(rows[0]?.proconfig).toContain('enable_seqscan=off');
  });

  it('refuses a row written without its content digest', async () => {
    await expect(s.c.db('audit_logs').insert({ user_id: null, action: 'test.raw', status: 'success' })).rejects.toThrow(/content digest/);
  });
});

describe('the migration', () => {
  it('chains the rows written before it, per account and in order, and the trigger goes on from there', async () => {
    const db = s.c.db;
    const a = await registerUser(s.api);
    // As the migrator runs it: in a transaction.
    await db.transaction((trx) => m023.down(trx));
    try {
      // Rows as they were before: no chain columns; one with microseconds and odd JSON.
      await db('audit_logs').insert([
        {
          user_id: a.id,
          action: 'old.one',
          status: 'success',
          details: JSON.stringify({ z: 1, a: [true, null, 1e21, 0.1], é: 'ü\n' }),
          created_at: db.raw(`'2025-01-02T03:04:05.123456Z'::timestamptz`),
        },
        { user_id: null, action: 'old.system', status: 'failure', target: 'x' },
        { user_id: a.id, action: 'old.two', status: 'failure', ip: '10.0.0.1', request_id: 'r1' },
      ]);
    } finally {
      await db.transaction((trx) => m023.up(trx));
    }
    const rows = await db('audit_logs')
      .where({ chain: a.id })
      .orderBy('sequence')
      .select(
        'action',
        'sequence',
        'prev_hash',
        'hash',
        'digest',
        'details',
        'target',
        'ip',
        'request_id',
        'status',
        db.raw(`to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at`),
      );
    expect(rows.map((r) => r.action).slice(-2)).toEqual(['old.one', 'old.two']);
    expect(rows.map((r) => r.sequence)).toEqual(rows.map((_, i) => i + 1));
    // The migration's own hashing agrees with the library's.
    const one = rows.find((r) => r.action === 'old.one')!;
    expect(one.created_at).toBe('2025-01-02T03:04:05.123456Z');
    expect(one.digest).toBe(rowDigest(one));
    expect(one.hash).toBe(linkHash({ chain: a.id, created_at: one.created_at, digest: one.digest, prev_hash: one.prev_hash, sequence: one.sequence }));
    await recordAudit(db, { user_id: a.id, action: 'new.row' as AuditAction, status: 'success' });
    const { offline, server } = await verdicts(a);
    expect(offline).toMatchObject({ ok: true, rows: rows.length + 1 });
    expect(server.ok).toBe(true);
    expect((await verifyChain(s.c, 'system')).ok).toBe(true);
  });
});

describe('checkpoints', () => {
  it('signs every moved head once with a sealed Ed25519 key the JWKS publishes, and delivers it as an event and a signed webhook', async () => {
    const u = await accountWithRows(3);
    const receiver = await startReceiver();
    try {
      const hook = await s.api('POST', '/webhooks', { token: u.token, body: { url: receiver.url, event_types: ['audit_checkpoints.signed'] } });
      expect(hook.status).toBe(201);
      const { signed } = await checkpointChains(s.c);
      expect(signed).toBeGreaterThan(0);
      expect((await checkpointChains(s.c)).signed).toBe(0); // nothing moved since

      const keys = await jwks();
      expect(keys.keys.length).toBeGreaterThan(0);
      const stored = await s.c.db('audit_signing_keys').whereNull('retired_at').first();
      expect(stored.private_sealed).toMatch(/^s1\./);
      expect(JSON.stringify(keys)).not.toContain(stored.private_sealed);
      expect(keys.keys.find((k) => k.kid === stored.kid)).toMatchObject({ kty: 'OKP', crv: 'Ed25519', alg: 'EdDSA', use: 'sig' });
      expect(Object.keys(keys.keys[0])).not.toContain('d');

      const head = await s.c.db('audit_chains').where({ chain: u.id }).first();
      const cp = await s.c.db('audit_checkpoints').where({ chain: u.id }).first();
      expect(cp).toMatchObject({ sequence: head.sequence, hash: head.hash });
      // An independent JWS implementation verifies it with the published keys.
      const checked = await compactVerify(cp.jws, createLocalJWKSet(keys as never));
      expect(JSON.parse(new TextDecoder().decode(checked.payload))).toMatchObject({ chain: u.id, sequence: head.sequence, hash: head.hash });

      const events = await s.api('GET', '/events/history?types=audit_checkpoints.signed', { token: u.token });
      expect(events.body.items).toMatchObject([
        { type: 'audit_checkpoints.signed', data: { sequence: head.sequence, hash: head.hash, kid: stored.kid, jws: cp.jws } },
      ]);

      await expect.poll(() => receiver.received.length, { timeout: 15_000 }).toBeGreaterThan(0);
      const delivery = receiver.received[0];
      const payload = new Webhook(hook.body.secret.replace(/^whsec_/, '')).verify(delivery.body, signedHeaders(delivery)) as {
        type: string;
        data: { jws: string };
      };
      expect(payload.type).toBe('audit_checkpoints.signed');
      const fromHook = await compactVerify(payload.data.jws, createLocalJWKSet(keys as never));
      expect(JSON.parse(new TextDecoder().decode(fromHook.payload))).toMatchObject({ sequence: head.sequence });

      const { offline, server } = await verdicts(u);
      expect(offline).toMatchObject({ ok: true, checkpoints: 1, last_checkpoint_sequence: head.sequence, unanchored_rows: 0 });
      expect(server).toEqual(offline);
    } finally {
      await receiver.close();
    }
  });

  it('replaces an old signing key, keeps publishing the retired one, and old checkpoints still verify', async () => {
    const u = await accountWithRows(1);
    await checkpointChains(s.c);
    const first = await s.c.db('audit_signing_keys').whereNull('retired_at').first();
    await recordAudit(s.c.db, { user_id: u.id, action: 'test.later' as AuditAction, status: 'success' });
    await withClockAhead(s.c.clock as ManualClockFollowingTime, 91 * 86400_000, () => checkpointChains(s.c));
    const keys = await jwks();
    const old = keys.keys.find((k) => k.kid === first.kid) as unknown as { retired_at: string | null };
    expect(old.retired_at).not.toBeNull();
    expect(keys.keys.filter((k) => (k as unknown as { retired_at: string | null }).retired_at === null)).toHaveLength(1);
    const kids = (await s.c.db('audit_checkpoints').where({ chain: u.id }).orderBy('sequence').pluck('kid')) as string[];
    expect(kids[0]).toBe(first.kid);
    expect(kids[kids.length - 1]).not.toBe(first.kid);
    const { offline } = await verdicts(u);
    expect(offline).toMatchObject({ ok: true, checkpoints: 2, unanchored_rows: 0 });
  });
});

describe('the export', () => {
  it('resumes from a sequence number, and the resumed part verifies against its checkpoints', async () => {
    const u = await accountWithRows(6);
    await checkpointChains(s.c);
    const all = await exportOf(u.token);
    const rows = all.filter((l) => l.type === 'row');
    const resumed = await exportOf(u.token, 4);
    expect(resumed[0]).toMatchObject({ type: 'header', chain: u.id, from_sequence: 4 });
    expect(resumed.filter((l) => l.type === 'row')).toEqual(rows.slice(3));
    const verifier = new EvidenceVerifier(await jwks());
    for (const line of resumed) expect(verifier.add(line)).toBe(true);
    expect(verifier.verdict()).toMatchObject({ ok: true, first_sequence: 4, unanchored_rows: 0 });
    expect(JSON.stringify(all)).not.toMatch(/password|private_sealed|digest/);
  });

  it('refuses a bad resume point, and without credentials', async () => {
    const u = await registerUser(s.api);
    for (const q of ['0', '-1', 'x', '1.5']) expect((await s.api('GET', `/audit-logs/export?from_sequence=${q}`, { token: u.token })).status).toBe(422);
    expect((await s.api('GET', '/audit-logs/export')).status).toBe(401);
    expect((await s.api('GET', '/audit-logs/verify')).status).toBe(401);
    const beyond = await exportOf(u.token, 1000);
    expect(beyond.map((l) => l.type)).toEqual(['header']);
  });

  it('verifies an account server-side at most AUDIT_VERIFICATIONS_PER_HOUR times an hour, then answers 429 with Retry-After', async () => {
    const [u, other] = [await registerUser(s.api), await registerUser(s.api)];
    const verify = (token: string) => s.api('GET', '/audit-logs/verify', { token });
    const answers = await Promise.all(Array.from({ length: AUDIT_VERIFICATIONS_PER_HOUR + 5 }, () => verify(u.token)));
    expect(answers.filter((r) => r.status === 200)).toHaveLength(AUDIT_VERIFICATIONS_PER_HOUR);
    const refused = answers.find((r) => r.status === 429)!;
    expect(refused.body).toMatchObject({ code: 'rate_limited' });
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0);
    expect((await verify(other.token)).status).toBe(200); // one account's budget, not the service's
  });
});

describe('a long chain', () => {
  it('exports 100,000 rows as a stream and verifies them as a stream', { timeout: 300_000 }, async () => {
    const u = await registerUser(s.api);
    const content = { action: 'test.bulk', status: 'success', target: null, ip: null, request_id: null, details: {} };
    // A thousand rows per statement, the trigger chaining each row as recordAudit's would be.
    for (let i = 0; i < 100; i++)
      await s.c.db.raw(
        `INSERT INTO audit_logs (user_id, action, status, details, digest) SELECT ?, 'test.bulk', 'success', '{}', ? FROM generate_series(1, 1000)`,
        [u.id, rowDigest(content)],
      );
    await checkpointChains(s.c);
    const verifier = new EvidenceVerifier(await jwks());
    const res = await fetch(`${s.url}/audit-logs/export`, { headers: { authorization: `Bearer ${u.token}` } });
    const decoder = new TextDecoder();
    let rest = '';
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      rest += decoder.decode(chunk, { stream: true });
      const lines = rest.split('\n');
      rest = lines.pop()!;
      for (const line of lines) verifier.add(JSON.parse(line) as ExportLine);
    }
    const verdict = verifier.verdict();
    expect(verdict).toMatchObject({ ok: true, checkpoints: 1, unanchored_rows: 0 });
    expect(verdict.rows).toBeGreaterThan(100_000);
  });
});

describe('the verifier on malformed exports', () => {
  it('reports an empty file, a missing header, a malformed row and a header of another chain as breaks, never as evidence', async () => {
    const keys = await jwks();
    const verdictOf = (lines: unknown[]) => {
      const v = new EvidenceVerifier(keys);
      for (const l of lines) if (!v.add(l as ExportLine)) break;
      return v.verdict();
    };
    expect(verdictOf([])).toMatchObject({ ok: false, first_break: { reason: expect.stringMatching(/empty/) } });
    const u = await accountWithRows(2);
    const lines = await exportOf(u.token);
    expect(verdictOf(lines.slice(1))).toMatchObject({ ok: false, first_break: { sequence: 1, reason: expect.stringMatching(/header/) } });
    const { details: _gone, ...noDetails } = lines[2] as Extract<ExportLine, { type: 'row' }>;
    expect(verdictOf([lines[0], lines[1], noDetails])).toMatchObject({ ok: false, first_break: { sequence: 2, reason: expect.stringMatching(/malformed/) } });
    expect(verdictOf([lines[0], lines[1], { ...lines[0], chain: 'system', from_sequence: 2 }])).toMatchObject({ ok: false, first_break: { sequence: 2 } });
    expect(verdictOf([lines[0], lines[1], { ...lines[0], from_sequence: 2 }, ...lines.slice(2)])).toMatchObject({ ok: true });
  });
});

describe('tampering done directly in Postgres', () => {
  /** An account with 6 rows beyond registering, checkpointed; answers the sequence of its 3rd test row. */
  async function checkpointed() {
    const u = await accountWithRows(6);
    await checkpointChains(s.c);
    const rows = await rowsOf(u.id);
    return { u, rows, third: rows[rows.length - 4]! };
  }

  const expectBreak = async (u: User, sequence: number, reason: RegExp) => {
    const { offline, server } = await verdicts(u);
    expect(offline.ok).toBe(false);
    expect(offline.first_break).toMatchObject({ sequence });
    expect(offline.first_break!.reason).toMatch(reason);
    expect(server.first_break).toEqual(offline.first_break);
  };

  it('finds an edited field', async () => {
    const { u, third } = await checkpointed();
    await s.c
      .db('audit_logs')
      .where({ id: third.id })
      .update({ details: JSON.stringify({ i: 99 }) });
    await expectBreak(u, third.sequence, /does not match its hash/);
  });

  it("hashes a row's client_request_id: the row verifies with it, and setting, changing or clearing it breaks there", async () => {
    const u = await accountWithRows(2);
    await recordAudit(
      s.c.db,
      { user_id: u.id, action: 'test.client_id' as AuditAction, status: 'success' },
      { ip: '192.0.2.1', requestId: 'ours', clientRequestId: 'theirs:1' },
    );
    await recordAudit(s.c.db, { user_id: u.id, action: 'test.row' as AuditAction, status: 'success' });
    const [withId] = await s.c.db('audit_logs').where({ chain: u.id, action: 'test.client_id' });
    expect(withId).toMatchObject({ request_id: 'ours', client_request_id: 'theirs:1' });
    expect((await exportOf(u.token)).find((l) => l.type === 'row' && l.sequence === withId.sequence)).toMatchObject({ client_request_id: 'theirs:1' });
    expect((await verdicts(u)).offline).toMatchObject({ ok: true, first_break: null });
    const plain = await s.c
      .db('audit_logs')
      .where({ chain: u.id, sequence: withId.sequence - 1 })
      .first();
    for (const [row, value] of [
      [withId, 'theirs:2'],
      [withId, null],
      [plain, 'theirs:1'],
    ] as const) {
      await s.c.db('audit_logs').where({ id: row.id }).update({ client_request_id: value });
      await expectBreak(u, row.sequence, /does not match its hash/);
      await s.c.db('audit_logs').where({ id: row.id }).update({ client_request_id: row.client_request_id });
    }
    expect((await verdicts(u)).offline.ok).toBe(true);
    // Only the form the API keeps is stored (migration 031).
    await expect(
      recordAudit(
        s.c.db,
        { user_id: u.id, action: 'test.client_id' as AuditAction, status: 'success' },
        { ip: null, request_id: 'ours', client_request_id: 'FORGED text' },
      ),
    ).rejects.toMatchObject({ code: '23514' });
  });

  it('finds an edited field whose hashes were computed again down the chain', async () => {
    const { u, rows, third } = await checkpointed();
    // The forger recomputes the edited row and every later one: only the signed checkpoint disagrees.
    await s.c.db('audit_logs').where({ id: third.id }).update({ target: 'forged' });
    const all = await s.c
      .db('audit_logs')
      .where({ chain: u.id })
      .andWhere('sequence', '>=', third.sequence)
      .orderBy('sequence')
      .select(
        'id',
        'sequence',
        'action',
        'status',
        'target',
        'ip',
        'request_id',
        'details',
        s.c.db.raw(`to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at`),
      );
    let prev = rows.find((r) => r.sequence === third.sequence - 1)!.hash as string;
    for (const r of all) {
      const digest = rowDigest(r);
      const hash = linkHash({ chain: u.id, created_at: r.created_at, digest, prev_hash: prev, sequence: r.sequence });
      await s.c.db('audit_logs').where({ id: r.id }).update({ digest, prev_hash: prev, hash });
      prev = hash;
    }
    await expectBreak(u, rows[rows.length - 1]!.sequence, /chain up to it was rewritten/);
  });

  it('finds a deleted row', async () => {
    const { u, third } = await checkpointed();
    await s.c.db('audit_logs').where({ id: third.id }).delete();
    await expectBreak(u, third.sequence, /missing \(deleted\)/);
  });

  it('finds a deleted tail that a checkpoint covers', async () => {
    const { u, rows } = await checkpointed();
    await s.c
      .db('audit_logs')
      .where({ chain: u.id })
      .andWhere('sequence', '>=', rows.length - 1)
      .delete();
    await expectBreak(u, rows.length, /missing \(deleted\)/);
  });

  it('finds an inserted row', async () => {
    const { u, third } = await checkpointed();
    // The forger bypasses the trigger and slips a row in after the third, renumbering what follows.
    await s.c.db.transaction(async (trx) => {
      await trx.raw('SET LOCAL session_replication_role = replica');
      await trx.raw('UPDATE audit_logs SET sequence = -sequence - 1 WHERE chain = ? AND sequence > ?', [u.id, third.sequence]);
      await trx.raw('UPDATE audit_logs SET sequence = -sequence WHERE chain = ? AND sequence < 0', [u.id]);
      const created_at = '2026-01-01T00:00:00.000000Z';
      const forged = { action: 'test.forged', status: 'success', target: null, ip: null, request_id: null, details: {} };
      const digest = rowDigest(forged);
      const hash = linkHash({ chain: u.id, created_at, digest, prev_hash: third.hash, sequence: third.sequence + 1 });
      await trx('audit_logs').insert({
        ...forged,
        details: '{}',
        user_id: u.id,
        chain: u.id,
        sequence: third.sequence + 1,
        digest,
        prev_hash: third.hash,
        hash,
        created_at,
      });
    });
    await expectBreak(u, third.sequence + 2, /does not match its hash/);
  });

  it('finds two rows whose sequence numbers were swapped', async () => {
    const { u, third } = await checkpointed();
    await s.c.db.transaction(async (trx) => {
      await trx('audit_logs').where({ chain: u.id, sequence: third.sequence }).update({ sequence: -1 });
      await trx('audit_logs')
        .where({ chain: u.id, sequence: third.sequence + 1 })
        .update({ sequence: third.sequence });
      await trx('audit_logs')
        .where({ chain: u.id, sequence: -1 })
        .update({ sequence: third.sequence + 1 });
    });
    await expectBreak(u, third.sequence, /does not match its hash/);
  });

  it('finds a checkpoint whose signature was replaced', async () => {
    const { u, rows } = await checkpointed();
    const cp = await s.c.db('audit_checkpoints').where({ chain: u.id }).first();
    const [h, p, sig] = (cp.jws as string).split('.') as [string, string, string];
    const flipped = Buffer.from(sig, 'base64url');
    flipped[0] ^= 1;
    await s.c
      .db('audit_checkpoints')
      .where({ id: cp.id })
      .update({ jws: `${h}.${p}.${flipped.toString('base64url')}` });
    await expectBreak(u, rows.length, /signature that does not match/);
  });

  it("finds a checkpoint moved from another account's chain", async () => {
    const { u, rows } = await checkpointed();
    const other = await checkpointed();
    const theirs = await s.c.db('audit_checkpoints').where({ chain: other.u.id }).first();
    await s.c.db('audit_checkpoints').where({ chain: u.id }).update({ jws: theirs.jws });
    await expectBreak(u, rows.length, /another account's chain|says something else/);
  });
});

describe('kms audit export and verify', () => {
  const BIN = fileURLToPath(new URL('../../cli/kms.mjs', import.meta.url));
  const kms = (args: string[], env: Record<string, string>) =>
    new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
      execFile(process.execPath, [BIN, ...args], { env: { PATH: process.env.PATH!, HOME: tmpdir(), KMS_URL: s.url, ...env } }, (err, stdout, stderr) =>
        resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
      );
    });

  it('exports, resumes an interrupted file, verifies offline with saved keys, and exits 1 at the row an edit broke', async () => {
    const u = await accountWithRows(8);
    await checkpointChains(s.c);
    await recordAudit(s.c.db, { user_id: u.id, action: 'test.after_checkpoint' as AuditAction, status: 'success' });
    const dir = await mkdtemp(join(tmpdir(), 'kms-audit-'));
    try {
      const env = { KMS_API_KEY: u.apiKey };
      const file = join(dir, 'audit.ndjson');
      expect((await kms(['audit', 'export', '-o', file], env)).code).toBe(0);
      const whole = await readFile(file, 'utf8');
      // Cut it inside the fifth row's line, as an interrupted download would, then resume.
      const lines = whole.split('\n');
      await writeFile(file, `${lines.slice(0, 5).join('\n')}\n${lines[5].slice(0, 20)}`);
      expect((await kms(['audit', 'export', '-o', file, '--resume'], env)).code).toBe(0);
      const resumed = (await readFile(file, 'utf8'))
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as ExportLine);
      expect(resumed.filter((l) => l.type === 'row')).toEqual(
        whole
          .split('\n')
          .filter(Boolean)
          .map((l) => JSON.parse(l) as ExportLine)
          .filter((l) => l.type === 'row'),
      );

      const keysFile = join(dir, 'keys.json');
      await writeFile(keysFile, JSON.stringify(await jwks()));
      const ok = await kms(['audit', 'verify', file, '--keys', keysFile, '--json'], {});
      expect(ok.code, ok.stderr).toBe(0);
      expect(JSON.parse(ok.stdout)).toMatchObject({ ok: true, unanchored_rows: 1, first_break: null });
      expect((await kms(['audit', 'verify', file], {})).stdout).toMatch(/^OK: .* 1 row\(s\) after the last checkpoint are protected by the chain alone/);

      const rows = await rowsOf(u.id);
      await s.c.db('audit_logs').where({ id: rows[2]!.id }).update({ status: 'failure' });
      const tampered = join(dir, 'tampered.ndjson');
      expect((await kms(['audit', 'export', '-o', tampered], env)).code).toBe(0);
      const broken = await kms(['audit', 'verify', tampered, '--keys', keysFile], {});
      expect(broken.code).toBe(1);
      expect(broken.stdout).toMatch(/^BROKEN at row 3: Row 3 does not match its hash/);
      expect(broken.stderr).toContain('the audit evidence breaks at row 3');
      // A key the file's signatures were not made with: every checkpoint fails.
      await writeFile(keysFile, JSON.stringify({ keys: [] }));
      expect((await kms(['audit', 'verify', file, '--keys', keysFile], {})).stdout).toMatch(/published keys do not hold/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
