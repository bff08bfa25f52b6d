import { createPrivateKey, createPublicKey, type KeyObject } from 'node:crypto';
import type { Knex } from 'knex';
import { generateRawKeyPair } from '../curve25519';
import { CompactSign, calculateJwkThumbprint } from 'jose';
import type { Container } from '../container';
import {
  CHECKPOINT_TYP,
  EXPORT_FORMAT,
  EvidenceVerifier,
  checkpointLink,
  type Break,
  type CheckpointClaim,
  type ExportLine,
  type Jwk,
  type Verdict,
} from '../audit-chain';
import { emitEvent } from '../events';
import { consume } from '../auth/limiters';
import { clearBreak, recordBreak, rememberCheckpoint, rememberedCheckpoint } from './signer-memory';
import {
  chainCheckpoints,
  chainRows,
  checkpointBefore,
  nextChainSequence,
  currentSigningKey,
  insertNextCheckpoint,
  movedChains,
  replaceSigningKey,
  signingKeys,
  type CheckpointRow,
} from '../../db/audit-evidence';

/**
 * Audit evidence the operator cannot take back (docs/audit-evidence.md): signed checkpoints of every
 * chain's head, delivered to the account as `audit_checkpoints.signed` events; the published keys (a JWKS that
 * keeps retired keys); the export and the server's own verification of it.
 */

/** The AAD of a checkpoint signing key's sealed private part. */
export const signingKeyAad = (kid: string) => `audit-signing-key:${kid}`;
const uniqueViolation = (err: unknown) => (err as { code?: string }).code === '23505';

/** The current signing key; a new one when there is none or it is older than AUDIT_SIGNING_KEY_DAYS (the old one is retired, still published). */
async function signingKey(c: Container): Promise<{ kid: string; key: KeyObject }> {
  const now = c.clock.now();
  const current = await currentSigningKey(c.db);
  if (current && now.getTime() - current.created_at.getTime() < c.config.auditCheckpoints.signingKeyMaxAgeMs) {
    return {
      kid: current.kid,
      key: createPrivateKey({ key: c.sealer.open(current.private_sealed, signingKeyAad(current.kid)), format: 'der', type: 'pkcs8' }),
    };
  }
  // Made from raw bytes, as every Curve25519 key of the service is (lib/curve25519.ts says why).
  const pair = generateRawKeyPair('ed25519');
  const publicJwk = { kty: 'OKP', crv: 'Ed25519', x: pair.x.toString('base64url') };
  const kid = await calculateJwkThumbprint(publicJwk, 'sha256');
  const privateDer = pair.privateKey.export({ format: 'der', type: 'pkcs8' });
  try {
    await replaceSigningKey(c.db, { kid, public_jwk: publicJwk, private_sealed: c.sealer.seal(privateDer, signingKeyAad(kid)), created_at: now }, now);
  } catch (err) {
    // Another scheduler replaced it at the same moment: use theirs.
    if (uniqueViolation(err)) return signingKey(c);
    throw err;
  }
  c.log.info({ kid }, 'audit signing key created');
  return { kid, key: pair.privateKey };
}

type PublishedKey = Jwk & { kid: string; alg: 'EdDSA'; use: 'sig'; created_at: string; retired_at: string | null };

/**
 * The published keys: every signing key ever used, so that old checkpoints still verify. Each public key
 * is taken from its sealed private key, never from a column a database writer could replace with a key
 * of their own; a key whose sealed part does not open to its kid is left out (what it signed fails).
 */
export async function auditJwks(c: Container): Promise<{ keys: PublishedKey[] }> {
  const keys: PublishedKey[] = [];
  for (const k of await signingKeys(c.db)) {
    try {
      const priv = createPrivateKey({ key: c.sealer.open(k.private_sealed, signingKeyAad(k.kid)), format: 'der', type: 'pkcs8' });
      const { kty, crv, x } = createPublicKey(priv).export({ format: 'jwk' });
      const jwk = { kty: kty!, crv: crv!, x: x! };
      if ((await calculateJwkThumbprint(jwk, 'sha256')) !== k.kid) throw new Error('the sealed key is not the key its kid names');
      keys.push({
        ...jwk,
        kid: k.kid,
        alg: 'EdDSA',
        use: 'sig',
        created_at: k.created_at.toISOString(),
        retired_at: k.retired_at?.toISOString() ?? null,
      });
    } catch (err) {
      c.log.error({ err, kid: k.kid }, 'audit signing key left out of the published keys: its sealed private key does not open to it');
    }
  }
  return { keys };
}

const BATCH = 500;

const checkpointOut = (cp: CheckpointRow): ExportLine => ({
  type: 'checkpoint',
  sequence: cp.sequence,
  hash: cp.hash,
  chain: cp.chain,
  signed_at: cp.signed_at.toISOString(),
  kid: cp.kid,
  jws: cp.jws,
});

/** Keeps each verification to one snapshot: rows and checkpoints as they were at one moment. */
const SNAPSHOT = { isolationLevel: 'repeatable read', readOnly: true } as const;

/**
 * Whether `chain` is evidence the signer can extend: from the checkpoint before the last one it signed
 * (remembered outside Postgres, or else the newest stored), every stored row and checkpoint verifies
 * with the real keys, the checkpoints follow each other, and the last one it signed is still stored and
 * still covers its row. Answers the tip to extend: the last row and the last checkpoint.
 */
async function checkLinks(
  c: Container,
  chain: string,
  jwks: { keys: Jwk[] },
  remembered: { sequence: number; jws: string } | null,
): Promise<{ tip: ReturnType<EvidenceVerifier['tip']> } | { broken: Break }> {
  return c.db.transaction(async (trx) => {
    const anchor = remembered?.sequence ?? (await checkpointBefore(trx, chain))?.sequence ?? 0;
    const from = anchor > 0 ? ((await checkpointBefore(trx, chain, anchor))?.sequence ?? 1) : 1;
    const verifier = new EvidenceVerifier(jwks, remembered ? [remembered.jws] : []);
    for await (const line of exportLines(trx, chain, from, c.clock.now())) if (!verifier.add(line)) break;
    const { first_break } = verifier.verdict();
    return first_break ? { broken: first_break } : { tip: verifier.tip() };
  }, SNAPSHOT);
}

/** A break found: never signed; raised on every channel an operator or the account watches. */
async function chainBroken(c: Container, chain: string, b: Break): Promise<void> {
  const now = c.clock.now();
  c.metrics.auditChainBreaks.inc({ chain: chain === 'system' ? 'system' : 'account' });
  c.log.error({ chain, sequence: b.sequence, reason: b.reason }, 'audit chain broken: its head is not signed');
  if ((await recordBreak(c, chain, b, now)) && chain !== 'system')
    await emitEvent(c, chain, 'audit_chains.broken', { sequence: b.sequence, reason: b.reason, detected_at: now.toISOString() });
}

interface SignerState {
  jwks: { keys: Jwk[] } | null;
  signer: { kid: string; key: KeyObject } | null;
  /** Chains with stored checkpoints but none remembered (a Redis that lost its data, or the first run). */
  unremembered: number;
}

/** Checks one chain and signs its head when it moved past its last checkpoint. */
async function checkpointChain(c: Container, chain: string, state: SignerState): Promise<'signed' | 'unchanged' | 'broken'> {
  const remembered = await rememberedCheckpoint(c, chain);
  state.jwks ??= await auditJwks(c);
  let checked = await checkLinks(c, chain, state.jwks, remembered);
  if ('broken' in checked) {
    // A key or a checkpoint another signer made after this run read the keys: read them again once.
    state.jwks = await auditJwks(c);
    checked = await checkLinks(c, chain, state.jwks, remembered);
  }
  if ('broken' in checked) {
    await chainBroken(c, chain, checked.broken);
    return 'broken';
  }
  await clearBreak(c, chain);
  const { row, checkpoint } = checked.tip;
  if (checkpoint && !remembered) state.unremembered++;
  // Stored by another signer that could not remember it (it stopped in between): it verified, so it is the last.
  if (checkpoint && (remembered?.sequence ?? 0) < checkpoint.sequence) await rememberCheckpoint(c, chain, checkpoint);
  if (!row || row.sequence <= (checkpoint?.sequence ?? 0)) return 'unchanged';

  state.signer ??= await signingKey(c);
  const claim: CheckpointClaim = {
    chain,
    sequence: row.sequence,
    hash: row.hash,
    signed_at: c.clock.now().toISOString(),
    prev: checkpoint ? checkpointLink(checkpoint) : null,
  };
  const jws = await new CompactSign(new TextEncoder().encode(JSON.stringify(claim)))
    .setProtectedHeader({ alg: 'EdDSA', kid: state.signer.kid, typ: CHECKPOINT_TYP })
    .sign(state.signer.key);
  const stored = await insertNextCheckpoint(
    c.db,
    { chain, sequence: claim.sequence, hash: claim.hash, signed_at: new Date(claim.signed_at), kid: state.signer.kid, jws },
    checkpoint?.sequence ?? 0,
  );
  if (!stored) return 'unchanged';
  await rememberCheckpoint(c, chain, stored);
  if (chain !== 'system')
    await emitEvent(c, chain, 'audit_checkpoints.signed', {
      sequence: stored.sequence,
      hash: stored.hash,
      signed_at: stored.signed_at.toISOString(),
      kid: stored.kid,
      jws: stored.jws,
    });
  return 'signed';
}

/**
 * Signs the head of every chain that moved since its last checkpoint, once it verified that the head
 * extends what was signed before, and sends each account its own as an `audit_checkpoints.signed` event; a
 * chain that does not verify is not signed but raised (`audit_chains.broken`). The `system` chain, which
 * no account holds, is verified on every run, moved or not. Safe to run twice at once: a checkpoint
 * is stored once per chain and place, and only the run that stored it announces it.
 */
export async function checkpointChains(c: Container): Promise<{ signed: number; broken: number }> {
  const state: SignerState = { jwks: null, signer: null, unremembered: 0 };
  let signed = 0;
  let broken = 0;
  let system = false;
  const count = (outcome: Awaited<ReturnType<typeof checkpointChain>>) => {
    if (outcome === 'signed') signed++;
    if (outcome === 'broken') broken++;
  };
  for (let after = ''; ;) {
    const heads = await movedChains(c.db, after, BATCH);
    for (const head of heads) {
      system ||= head.chain === 'system';
      count(await checkpointChain(c, head.chain, state));
    }
    if (heads.length < BATCH) break;
    after = heads[heads.length - 1].chain;
  }
  if (!system) count(await checkpointChain(c, 'system', state));
  if (state.unremembered)
    c.log.warn(
      { chains: state.unremembered },
      'audit chains with stored checkpoints that the signer did not remember: continued from the newest stored (a lost Redis cannot show deleted checkpoints)',
    );
  return { signed, broken };
}

/** The export's lines from `db` (the service's connection, or a snapshot); exportChain says what they are. */
async function* exportLines(db: Knex, chain: string, from: number, at: Date): AsyncGenerator<ExportLine> {
  yield { type: 'header', format: EXPORT_FORMAT, chain, from_sequence: from, exported_at: at.toISOString() };
  // `next`: the next row to read; `listed`: checkpoints below it are out (also those of deleted rows).
  for (let next = from, listed = from; ;) {
    const rows = await chainRows(db, chain, next, BATCH);
    if (!rows.length) {
      const after = await nextChainSequence(db, chain, next);
      if (after === null) {
        for (const cp of await chainCheckpoints(db, chain, listed)) yield checkpointOut(cp);
        return;
      }
      next = after;
      continue;
    }
    const last = rows[rows.length - 1].sequence;
    const checkpoints = await chainCheckpoints(db, chain, listed, last);
    let k = 0;
    for (const { renamed_to, ...r } of rows) {
      yield { type: 'row', ...r, ...(renamed_to !== null && { renamed_to }) };
      while (k < checkpoints.length && checkpoints[k].sequence <= r.sequence) yield checkpointOut(checkpoints[k++]);
    }
    next = listed = last + 1;
  }
}

/**
 * The export of one account's chain from sequence `from`, line by line and a page at a time (flat
 * memory whatever its size): a header, the rows in order, each checkpoint after the row it covers, and
 * checkpoints past the last row at the end (their rows are gone: the verifiers say so).
 */
export const exportChain = (c: Container, chain: string, from: number): AsyncGenerator<ExportLine> => exportLines(c.db, chain, from, c.clock.now());

/**
 * The account's own chain, verified by the service: AUDIT_VERIFICATIONS_PER_HOUR per account (each reads
 * the whole trail), from `from` (a route's reader). A replica behind the primary may lack the checkpoint
 * the signer last remembers, which reads as a deletion: a verdict that is not ok there is checked again on
 * the primary, so only the primary ever reports a break.
 */
export async function verifyAccountChain(c: Container, userId: string, from: Container = c): Promise<Verdict> {
  await consume(
    c.limiters.auditVerify,
    userId,
    'Too many audit verifications for this account; try again later, or verify an export offline (kms audit verify).',
  );
  const verdict = await verifyChain(from, userId);
  return verdict.ok || from.db === c.db ? verdict : verifyChain(c, userId);
}

/**
 * The server's own check of a chain: the same verifier as `kms audit verify`, on the same export, with
 * the last checkpoint the signer remembers (outside Postgres) as a checkpoint kept from earlier.
 */
export async function verifyChain(c: Container, chain: string): Promise<Verdict> {
  const remembered = await rememberedCheckpoint(c, chain);
  const verifier = new EvidenceVerifier(await auditJwks(c), remembered ? [remembered.jws] : []);
  for await (const line of exportChain(c, chain, 1)) if (!verifier.add(line)) break;
  return verifier.verdict();
}
