import { createPrivateKey, type KeyObject } from 'node:crypto';
import { generateRawKeyPair } from '../curve25519';
import { CompactSign, calculateJwkThumbprint } from 'jose';
import type { Container } from '../container';
import { CHECKPOINT_TYP, EXPORT_FORMAT, EvidenceVerifier, type CheckpointClaim, type ExportLine, type Jwk, type Verdict } from '../audit-chain';
import { emitEvent } from '../events';
import { consume } from '../auth/limiters';
import {
  chainCheckpoints,
  chainRows,
  currentSigningKey,
  insertCheckpoint,
  movedChains,
  replaceSigningKey,
  signingKeys,
  type CheckpointRow,
} from '../../db/audit-evidence';

/**
 * Audit evidence the operator cannot take back (docs/audit-evidence.md): signed checkpoints of every
 * chain's head, delivered to the account as `audit.checkpoint` events; the published keys (a JWKS that
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

/** The published keys: every signing key ever used, so that old checkpoints still verify. */
export async function auditJwks(
  c: Container,
): Promise<{ keys: (Jwk & { kid: string; alg: 'EdDSA'; use: 'sig'; created_at: string; retired_at: string | null })[] }> {
  const rows = await signingKeys(c.db);
  return {
    keys: rows.map((k) => ({
      ...k.public_jwk,
      kid: k.kid,
      alg: 'EdDSA' as const,
      use: 'sig' as const,
      created_at: k.created_at.toISOString(),
      retired_at: k.retired_at?.toISOString() ?? null,
    })),
  };
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

/**
 * Signs the head of every chain that moved since its last checkpoint and sends each account its own as
 * an `audit.checkpoint` event. Safe to run twice at once: a checkpoint is stored once per (chain,
 * sequence), and only the run that stored it announces it.
 */
export async function checkpointChains(c: Container): Promise<{ signed: number }> {
  let signed = 0;
  let signer: { kid: string; key: KeyObject } | undefined;
  for (let after = ''; ;) {
    const heads = await movedChains(c.db, after, BATCH);
    for (const head of heads) {
      signer ??= await signingKey(c);
      const claim: CheckpointClaim = { chain: head.chain, sequence: head.sequence, hash: head.hash, signed_at: c.clock.now().toISOString() };
      const jws = await new CompactSign(new TextEncoder().encode(JSON.stringify(claim)))
        .setProtectedHeader({ alg: 'EdDSA', kid: signer.kid, typ: CHECKPOINT_TYP })
        .sign(signer.key);
      const stored = await insertCheckpoint(c.db, { ...claim, signed_at: new Date(claim.signed_at), kid: signer.kid, jws });
      if (!stored) continue;
      signed++;
      if (head.chain !== 'system')
        await emitEvent(c, head.chain, 'audit.checkpoint', {
          sequence: stored.sequence,
          hash: stored.hash,
          signed_at: stored.signed_at.toISOString(),
          kid: stored.kid,
          jws: stored.jws,
        });
    }
    if (heads.length < BATCH) break;
    after = heads[heads.length - 1].chain;
  }
  return { signed };
}

/**
 * The export of one account's chain from sequence `from`, line by line and a page at a time (flat
 * memory whatever its size): a header, the rows in order, each checkpoint after the row it covers, and
 * checkpoints past the last row at the end (their rows are gone: the verifiers say so).
 */
export async function* exportChain(c: Container, chain: string, from: number): AsyncGenerator<ExportLine> {
  yield { type: 'header', format: EXPORT_FORMAT, chain, from_sequence: from, exported_at: c.clock.now().toISOString() };
  let next = from;
  for (;;) {
    const rows = await chainRows(c.db, chain, next, BATCH);
    if (!rows.length) break;
    const last = rows[rows.length - 1].sequence;
    const checkpoints = await chainCheckpoints(c.db, chain, next, last);
    let k = 0;
    for (const r of rows) {
      yield { type: 'row', ...r };
      while (k < checkpoints.length && checkpoints[k].sequence <= r.sequence) yield checkpointOut(checkpoints[k++]);
    }
    next = last + 1;
    if (rows.length < BATCH) break;
  }
  for (const cp of await chainCheckpoints(c.db, chain, next)) yield checkpointOut(cp);
}

/** The account's own chain, verified by the service: AUDIT_VERIFICATIONS_PER_HOUR per account (each reads the whole trail). */
export async function verifyAccountChain(c: Container, userId: string): Promise<Verdict> {
  await consume(
    c.limiters.auditVerify,
    userId,
    'Too many audit verifications for this account; try again later, or verify an export offline (kms audit verify).',
  );
  return verifyChain(c, userId);
}

/** The server's own check of an account's chain: the same verifier as `kms audit verify`, on the same export. */
export async function verifyChain(c: Container, chain: string): Promise<Verdict> {
  const verifier = new EvidenceVerifier(await auditJwks(c));
  for await (const line of exportChain(c, chain, 1)) if (!verifier.add(line)) break;
  return verifier.verdict();
}
