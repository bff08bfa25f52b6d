import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { registerUser, startTestService, type TestService } from '../support/service';
import { recordAudit } from '../../db/audit';
import { EvidenceVerifier, checkpointLink, type Jwk, type Verdict } from '../../lib/audit-chain';
import { checkpointChains, exportChain } from '../../lib/audit/audit-evidence';
import type { AuditAction } from '../../lib/event-names';

/**
 * The checkpoint signer signs only heads that extend what it signed before (docs/audit-evidence.md, "Who
 * can rewrite what"): a database writer who rewrites a chain and deletes the checkpoints that would
 * show it gets no signature, and the break is raised; kept checkpoints expose the rewrite offline.
 */
let s: TestService;
beforeAll(async () => {
  s = await startTestService();
});
afterAll(async () => {
  await s?.stop();
});

type User = Awaited<ReturnType<typeof registerUser>>;

const BIN = fileURLToPath(new URL('../../cli/kms.mjs', import.meta.url));
const kms = (args: string[], env: Record<string, string> = {}) =>
  new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(process.execPath, [BIN, ...args], { env: { PATH: process.env.PATH!, HOME: tmpdir(), KMS_URL: s.url, ...env } }, (err, stdout, stderr) =>
      resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });

const headOf = async (chain: string): Promise<number> => Number((await s.c.db('audit_chains').where({ chain }).first('sequence'))?.sequence ?? 0);

/** Audit rows on `chain` (an account id, or `system`) until its head is at `sequence`. */
async function rowsUpTo(chain: string, sequence: number): Promise<void> {
  for (let n = await headOf(chain); n < sequence; n++)
    await recordAudit(s.c.db, {
      user_id: chain === 'system' ? null : chain,
      action: 'test.row' as AuditAction,
      status: 'success',
      target: `t${n + 1}`,
      details: { n },
    });
  expect(await headOf(chain)).toBe(sequence);
}

/**
 * What a database writer can do without the signing key: delete rows `from` to `to` of `chain`,
 * renumber the rest, link them again with audit_link (migration 023), move the head, and delete the
 * checkpoints from `from` on.
 */
async function rewrite(chain: string, from: number, to: number): Promise<void> {
  await s.c.db.transaction(async (trx) => {
    await trx('audit_logs').where({ chain }).whereBetween('sequence', [from, to]).delete();
    await trx.raw('UPDATE audit_logs SET sequence = -(sequence - ?) WHERE chain = ? AND sequence > ?', [to - from + 1, chain, to]);
    await trx.raw('UPDATE audit_logs SET sequence = -sequence WHERE chain = ? AND sequence < 0', [chain]);
    let prev = (
      await trx('audit_logs')
        .where({ chain, sequence: from - 1 })
        .first('hash')
    ).hash as string;
    const ids = await trx('audit_logs').where({ chain }).andWhere('sequence', '>=', from).orderBy('sequence').select('id', 'sequence');
    for (const { id } of ids) {
      const { rows } = await trx.raw<{ rows: { hash: string }[] }>(
        'UPDATE audit_logs SET prev_hash = ?, hash = audit_link(chain, created_at, digest, ?, sequence) WHERE id = ? RETURNING hash',
        [prev, prev, id],
      );
      prev = rows[0].hash;
    }
    const head = await trx('audit_logs').where({ chain }).orderBy('sequence', 'desc').first('sequence', 'prev_hash', 'hash');
    await trx('audit_chains').where({ chain }).update(head);
    await trx('audit_checkpoints').where({ chain }).andWhere('sequence', '>=', from).delete();
  });
}

const jwks = async () => (await s.api('GET', '/audit-logs/keys')).body as { keys: Jwk[] };

/** The verdict on the chain's export as stored now, without and with the checkpoints kept from earlier. */
async function offline(chain: string, kept: string[] = []): Promise<Verdict> {
  const verifier = new EvidenceVerifier(await jwks(), kept);
  for await (const line of exportChain(s.c, chain, 1)) if (!verifier.add(line)) break;
  return verifier.verdict();
}

const checkpointsOf = async (chain: string): Promise<{ sequence: number; jws: string }[]> =>
  s.c.db('audit_checkpoints').where({ chain }).orderBy('sequence').select('sequence', 'jws');

const claimOf = (jws: string) => JSON.parse(Buffer.from(jws.split('.')[1], 'base64url').toString('utf8')) as { sequence: number; prev?: unknown };

async function admin(): Promise<User> {
  const u = await registerUser(s.api);
  await s.c.db('users').where({ id: u.id }).update({ role: 'admin' });
  return u;
}

const breaks = async (chain: 'account' | 'system') => (await s.c.metrics.auditChainBreaks.get()).values.find((v) => v.labels.chain === chain)?.value ?? 0;

describe('the signer', () => {
  it('chains each checkpoint to the one before, goes on without what it remembers, and a deleted checkpoint between two breaks the chain', async () => {
    const u = await registerUser(s.api);
    const cps: number[] = [];
    for (const n of [4, 6, 9]) {
      await rowsUpTo(u.id, n);
      await checkpointChains(s.c);
      cps.push(n);
    }
    // The signer's memory outside Postgres lost (a Redis restored without it): it goes on from the newest stored.
    await s.c.redis.del(`${s.config.redisPrefix}:audit:signed:${u.id}`);
    await rowsUpTo(u.id, 11);
    await checkpointChains(s.c);
    const stored = await checkpointsOf(u.id);
    expect(stored.map((c) => c.sequence)).toEqual([4, 6, 9, 11]);
    expect(claimOf(stored[0].jws).prev).toBeNull();
    for (let i = 1; i < stored.length; i++) expect(claimOf(stored[i].jws).prev).toEqual(checkpointLink(stored[i - 1]));
    // Honest extension verifies against every checkpoint kept on the way.
    expect(
      await offline(
        u.id,
        stored.map((c) => c.jws),
      ),
    ).toMatchObject({ ok: true, checkpoints: 4, unanchored_rows: 0 });

    await s.c.db('audit_checkpoints').where({ chain: u.id, sequence: 6 }).delete();
    expect((await offline(u.id)).first_break).toEqual({
      sequence: 9,
      reason: 'The checkpoint of row 9 does not follow the checkpoint of row 4: a checkpoint between them was deleted or replaced.',
    });
  });

  it('refuses to sign a chain rewritten after its checkpoint (rows deleted, renumbered, linked again, checkpoints deleted) and raises audit_chains.broken', async () => {
    const u = await registerUser(s.api);
    const op = await admin();
    await rowsUpTo(u.id, 16);
    await checkpointChains(s.c);
    await rowsUpTo(u.id, 22);
    // What the customer keeps: their audit_checkpoints.signed events, and the published keys.
    const events = (await s.api('GET', '/events/history?types=audit_checkpoints.signed', { token: u.token })).body.items as { data: { sequence: number } }[];
    expect(events.map((e) => e.data.sequence)).toEqual([16]);
    const dir = await mkdtemp(join(tmpdir(), 'kms-kept-'));
    try {
      const [keysFile, keptFile, exportFile] = ['keys.json', 'kept.ndjson', 'audit.ndjson'].map((f) => join(dir, f)) as [string, string, string];
      await writeFile(keysFile, JSON.stringify(await jwks()));
      await writeFile(keptFile, events.map((e) => `${JSON.stringify(e)}\n`).join(''));

      await rewrite(u.id, 16, 19);
      await recordAudit(s.c.db, { user_id: u.id, action: 'test.after' as AuditAction, status: 'success' });
      expect(await headOf(u.id)).toBe(19);
      // The stored evidence alone holds together: only what was signed before shows the rewrite.
      expect(await offline(u.id)).toMatchObject({ ok: true, checkpoints: 0 });

      const before = await breaks('account');
      await checkpointChains(s.c);
      expect(await checkpointsOf(u.id)).toEqual([]);
      expect(await breaks('account')).toBe(before + 1);
      const broken = await s.api('GET', '/events/history?types=audit_chains.broken', { token: u.token });
      expect(broken.body.items).toMatchObject([
        { type: 'audit_chains.broken', data: { sequence: 16, reason: expect.stringMatching(/Row 16 is not the row its signed checkpoint covers/) } },
      ]);
      const status = await s.api('GET', '/status', { token: op.token });
      expect(status.body).toMatchObject({ status: 'degraded', audit_chains: { broken: 1, chains: [{ chain: u.id, sequence: 16 }] } });
      const verify = await s.api('GET', '/audit-logs/verify', { token: u.token });
      expect(verify.body).toMatchObject({ ok: false, first_break: { sequence: 16 } });

      // Every later run refuses again, and tells the account once.
      await recordAudit(s.c.db, { user_id: u.id, action: 'test.later' as AuditAction, status: 'success' });
      await checkpointChains(s.c);
      expect(await checkpointsOf(u.id)).toEqual([]);
      expect((await s.api('GET', '/events/history?types=audit_chains.broken', { token: u.token })).body.items).toHaveLength(1);

      // Offline, with the checkpoints the customer kept: broken at the first row they contradict.
      expect((await kms(['audit', 'export', '-o', exportFile], { KMS_API_KEY: u.apiKey })).code).toBe(0);
      expect((await kms(['audit', 'verify', exportFile, '--keys', keysFile])).code).toBe(0); // the chain alone cannot tell
      const kept = await kms(['audit', 'verify', exportFile, '--keys', keysFile, '--checkpoints', keptFile]);
      expect(kept.code).toBe(1);
      expect(kept.stdout).toMatch(/^BROKEN at row 16: Row 16 is not the row its signed checkpoint covers/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('takes kept checkpoints only as evidence: a forged, foreign, deleted or unlisted one breaks the verdict', async () => {
    const [u, other] = [await registerUser(s.api), await registerUser(s.api)];
    await rowsUpTo(u.id, 5);
    await rowsUpTo(other.id, 3);
    await checkpointChains(s.c);
    const [mine] = await checkpointsOf(u.id);
    const [theirs] = await checkpointsOf(other.id);
    const [h, p, sig] = mine.jws.split('.') as [string, string, string];
    const flipped = Buffer.from(sig, 'base64url');
    flipped[0] ^= 1;
    expect((await offline(u.id, [`${h}.${p}.${flipped.toString('base64url')}`])).first_break?.reason).toMatch(
      /kept from earlier has a signature that does not match/,
    );
    expect((await offline(u.id, [theirs.jws])).first_break?.reason).toMatch(/kept from earlier signs another chain/);
    expect(await offline(u.id, [mine.jws])).toMatchObject({ ok: true });
    // Its row intact but the checkpoint itself gone from the database.
    await s.c.db('audit_checkpoints').where({ chain: u.id }).delete();
    expect((await offline(u.id, [mine.jws])).first_break).toEqual({
      sequence: 5,
      reason: 'The checkpoint of row 5, kept from earlier, is missing from the export: it was deleted.',
    });
    await s.c.db('audit_logs').where({ chain: u.id, sequence: 5 }).delete();
    expect((await offline(u.id, [mine.jws])).first_break).toEqual({ sequence: 5, reason: 'Row 5, which a signed checkpoint covers, is missing (deleted).' });
  });

  it('checks the system chain on every run, moved or not, and does not sign it rewritten', async () => {
    const op = await admin();
    const start = await headOf('system');
    await rowsUpTo('system', start + 3);
    await checkpointChains(s.c);
    await rowsUpTo('system', start + 6);
    await checkpointChains(s.c);
    const signed = await checkpointsOf('system');
    expect(signed.at(-1)!.sequence).toBe(start + 6);

    // The rows after the first checkpoint and the checkpoint after them deleted: the head is back at a
    // stored checkpoint, so the chain has not moved since its last checkpoint as the database tells it.
    await rewrite('system', start + 4, start + 6);
    expect(await headOf('system')).toBe(start + 3);
    const before = await breaks('system');
    expect((await checkpointChains(s.c)).broken).toBeGreaterThan(0);
    expect(await breaks('system')).toBe(before + 1);
    expect((await checkpointsOf('system')).at(-1)!.sequence).toBe(start + 3);
    const status = await s.api('GET', '/status', { token: op.token });
    expect(status.body.status).toBe('degraded');
    expect(status.body.audit_chains.chains).toContainEqual(expect.objectContaining({ chain: 'system', sequence: start + 6 }));
  });
});
