import { createHash, createPublicKey, verify } from 'node:crypto';

/**
 * The audit evidence rule, shared by the writer (db/audit.ts), the export and both verifiers (the API's
 * and `kms audit verify`, which needs nothing but an export and the published keys). Only node:crypto:
 * the command line bundles this file. docs/audit-evidence.md states the rule for other implementations.
 *
 *   digest = SHA-256(JCS({action, client_request_id?, details, ip, request_id, status, target}))
 *   hash   = SHA-256(JCS({chain, created_at, digest, prev_hash, sequence}))
 *
 * `client_request_id` is in the object only when the row has one (a row without one has the digest it had before the field existed).
 * JCS is RFC 8785; hashes are lowercase hex; `created_at` is UTC with microseconds; the first row of a
 * chain has `prev_hash` GENESIS. Postgres computes `hash` (the audit_logs trigger, migration 023).
 */

export const GENESIS = '0'.repeat(64);
const HEX64 = /^[0-9a-f]{64}$/;

/** The JWS `typ` of a checkpoint, so that no other signature of the key can pass for one. */
export const CHECKPOINT_TYP = 'kms-audit-checkpoint+jws';

/** The export's format name, in its first line. */
export const EXPORT_FORMAT = 'kms-audit-export/1';

/** RFC 8785 (JSON Canonicalization Scheme) of a JSON value: keys sorted by UTF-16 code units, ECMAScript number and string forms. */
function jcs(value: unknown): string {
  if (value === null || typeof value !== 'object') {
    if (typeof value === 'number' && !Number.isFinite(value)) throw new Error('JCS: a number must be finite');
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(jcs).join(',')}]`;
  const o = value as Record<string, unknown>;
  return `{${Object.keys(o)
    .filter((k) => o[k] !== undefined)
    .sort()
    .map((k) => `${JSON.stringify(k)}:${jcs(o[k])}`)
    .join(',')}}`;
}

const sha256 = (text: string) => createHash('sha256').update(text, 'utf8').digest('hex');

/** What a row's digest covers: everything it says, but not where it sits in its chain. */
export interface AuditContent {
  action: string;
  status: string;
  target: string | null;
  ip: string | null;
  request_id: string | null;
  /** The client's own X-Request-Id, when it sent a plain one (absent from exports made before there was one). */
  client_request_id?: string | null;
  details: Record<string, unknown>;
}

/** The row's content digest. `details` as JSON would carry it (a Date becomes its ISO string; undefined goes). */
export const rowDigest = (r: AuditContent) =>
  sha256(
    jcs({
      action: r.action,
      client_request_id: r.client_request_id ?? undefined,
      details: JSON.parse(JSON.stringify(r.details)) as unknown,
      ip: r.ip,
      request_id: r.request_id,
      status: r.status,
      target: r.target,
    }),
  );

export interface Link {
  chain: string;
  created_at: string;
  digest: string;
  prev_hash: string;
  sequence: number;
}

export const linkHash = (l: Link) => sha256(jcs({ chain: l.chain, created_at: l.created_at, digest: l.digest, prev_hash: l.prev_hash, sequence: l.sequence }));

/** Where a checkpoint follows the chain's checkpoint before it: its sequence and the SHA-256 of its compact JWS. */
export interface CheckpointLink {
  sequence: number;
  checkpoint: string;
}

/**
 * A checkpoint's signed claim: the chain's head at `sequence` had `hash`, and the checkpoint before
 * it was `prev` (null for the chain's first). Checkpoints signed before they were chained have no `prev`.
 */
export interface CheckpointClaim {
  chain: string;
  sequence: number;
  hash: string;
  signed_at: string;
  prev?: CheckpointLink | null;
}

/** What the next checkpoint's `prev` says of this one. */
export const checkpointLink = (cp: { sequence: number; jws: string }): CheckpointLink => ({ sequence: cp.sequence, checkpoint: sha256(cp.jws) });

/** The export, one JSON object per line: a header, then rows in sequence order, each checkpoint after the row it covers. */
export type ExportLine =
  | { type: 'header'; format: string; chain: string; from_sequence: number; exported_at: string }
  | ({
      type: 'row';
      audit_id: number;
      sequence: number;
      prev_hash: string;
      hash: string;
      created_at: string;
      /** The action's current name, when `action` (what the digest covers) is a legacy one: informative, not hashed. */
      renamed_to?: string;
    } & AuditContent)
  | ({ type: 'checkpoint'; kid: string; jws: string } & CheckpointClaim);

export interface Jwk {
  kty: string;
  crv?: string;
  x?: string;
  kid?: string;
  alg?: string;
  use?: string;
}

/** A base64url part of a compact JWS read as JSON: null when it is not an object. */
function jsonObject(part: string): Record<string, unknown> | null {
  const value: unknown = JSON.parse(Buffer.from(part, 'base64url').toString('utf8'));
  return typeof value === 'object' && value !== null ? (value as Record<string, unknown>) : null;
}

const validLink = (prev: unknown) =>
  prev === undefined ||
  prev === null ||
  (typeof prev === 'object' &&
    Number.isSafeInteger((prev as CheckpointLink).sequence) &&
    (prev as CheckpointLink).sequence >= 1 &&
    typeof (prev as CheckpointLink).checkpoint === 'string' &&
    HEX64.test((prev as CheckpointLink).checkpoint));

/** The claim of a compact JWS (EdDSA, Ed25519) signed by a key of `jwks`, or why it is not one. */
function verifyCheckpointJws(jws: string, jwks: { keys: Jwk[] }): { claim: CheckpointClaim; kid: string } | { error: string } {
  const parts = jws.split('.');
  if (parts.length !== 3 || !parts.every((p) => /^[A-Za-z0-9_-]*$/.test(p))) return { error: 'is not a compact JWS' };
  const [h, p, s] = parts as [string, string, string];
  let header: { alg?: unknown; kid?: unknown; typ?: unknown } | null;
  let claim: { [K in keyof CheckpointClaim]?: unknown } | null;
  try {
    header = jsonObject(h);
    claim = jsonObject(p);
  } catch {
    return { error: 'is not a compact JWS' };
  }
  if (!header || !claim) return { error: 'is not a compact JWS' };
  if (header.alg !== 'EdDSA' || header.typ !== CHECKPOINT_TYP || typeof header.kid !== 'string')
    return { error: 'is not a checkpoint signature (alg, typ or kid)' };
  const jwk = jwks.keys.find((k) => k.kid === header.kid);
  if (!jwk || jwk.kty !== 'OKP' || jwk.crv !== 'Ed25519' || !jwk.x)
    return { error: `is signed by key ${JSON.stringify(header.kid)}, which the published keys do not hold` };
  const key = createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: jwk.x }, format: 'jwk' });
  if (!verify(null, Buffer.from(`${h}.${p}`), key, Buffer.from(s, 'base64url'))) return { error: 'has a signature that does not match' };
  if (
    typeof claim.chain !== 'string' ||
    !Number.isSafeInteger(claim.sequence) ||
    typeof claim.hash !== 'string' ||
    typeof claim.signed_at !== 'string' ||
    !validLink(claim.prev)
  )
    return { error: 'signs an unknown claim' };
  return { claim: claim as CheckpointClaim, kid: header.kid };
}

const textOrNull = (v: unknown) => v === null || typeof v === 'string';

/** The fields a row line must have, of the right types, before its hash can be computed. */
function wellFormedRow(line: object): boolean {
  const r = line as Record<string, unknown>;
  return (
    Number.isSafeInteger(r.sequence) &&
    typeof r.prev_hash === 'string' &&
    typeof r.hash === 'string' &&
    HEX64.test(r.hash) &&
    typeof r.created_at === 'string' &&
    typeof r.action === 'string' &&
    typeof r.status === 'string' &&
    textOrNull(r.target) &&
    textOrNull(r.ip) &&
    textOrNull(r.request_id) &&
    (r.client_request_id === undefined || textOrNull(r.client_request_id)) &&
    typeof r.details === 'object' &&
    r.details !== null &&
    !Array.isArray(r.details)
  );
}

export interface Break {
  /** The sequence number where the evidence breaks (of the row, or of the checkpoint's row). */
  sequence: number;
  /** A sentence saying what is wrong there. */
  reason: string;
}

export interface Verdict {
  ok: boolean;
  chain: string | null;
  rows: number;
  checkpoints: number;
  first_sequence: number | null;
  last_sequence: number | null;
  /** The highest sequence a verified checkpoint signs: rows after it are protected by the chain alone. */
  last_checkpoint_sequence: number | null;
  unanchored_rows: number;
  first_break: Break | null;
}

/** A checkpoint kept from earlier (by the customer, or by the signer outside the database), once its signature was checked. */
interface Kept {
  claim: CheckpointClaim;
  jws: string;
  /** The export listed this very checkpoint. */
  listed: boolean;
}

/**
 * Checks an export line by line in constant memory (a resumed export appended to an interrupted one too) and stops at the first break: a row whose content
 * or place does not give its hash (a changed field, a swapped sequence), a row that does not follow the
 * previous one (a deleted, inserted or reordered row), a checkpoint whose signature does not verify
 * with the published keys or that signs another head than the rows have (a deleted tail, a rewritten chain),
 * a checkpoint that does not follow the one before it (a deleted or replaced checkpoint), and a checkpoint
 * kept from earlier (`kept`, compact JWSs) that the export's row at its sequence or its checkpoints contradict
 * (a chain rewritten and its later checkpoints deleted).
 */
export class EvidenceVerifier {
  private chain: string | null = null;
  private from = 1;
  private last: { sequence: number; hash: string } | null = null;
  private broken: Break | null = null;
  private rows = 0;
  private checkpoints = 0;
  private first: number | null = null;
  private anchored: number | null = null;
  /** The last checkpoint verified, and whether it carried its link to the one before. */
  private lastCheckpoint: { sequence: number; jws: string; chained: boolean } | null = null;
  /** Sorted by sequence; those before `nextKept` were found in the export, row and checkpoint. */
  private kept: Kept[] = [];
  private nextKept = 0;
  private keptError: string | null = null;

  constructor(
    private readonly jwks: { keys: Jwk[] },
    kept: string[] = [],
  ) {
    const bySequence = new Map<number, Kept>();
    for (const jws of kept) {
      const signed = verifyCheckpointJws(jws, jwks);
      if ('error' in signed) {
        this.keptError ??= `A checkpoint kept from earlier ${signed.error}.`;
        continue;
      }
      const seen = bySequence.get(signed.claim.sequence);
      if (seen && seen.jws !== jws) this.keptError ??= `Two checkpoints kept from earlier sign row ${signed.claim.sequence} differently.`;
      bySequence.set(signed.claim.sequence, { claim: signed.claim, jws, listed: false });
    }
    this.kept = [...bySequence.values()].sort((a, b) => a.claim.sequence - b.claim.sequence);
  }

  /** Feeds one line (parsed); answers false once the evidence is broken. */
  add(line: ExportLine): boolean {
    if (this.broken) return false;
    const at = this.last ? this.last.sequence + 1 : this.from;
    if (line.type === 'header') {
      if (typeof line.chain !== 'string' || !Number.isSafeInteger(line.from_sequence) || line.from_sequence < 1)
        return this.fail(at, 'The header line is malformed.');
      if (line.format !== EXPORT_FORMAT) return this.fail(at, `The export format ${JSON.stringify(line.format)} is not ${EXPORT_FORMAT}.`);
      // A resumed export appended to the first part: it goes on exactly where that part ended.
      if (this.chain !== null)
        return line.chain === this.chain && line.from_sequence === at
          ? true
          : this.fail(at, 'A header line of another chain or place was found inside the export.');
      this.chain = line.chain;
      this.from = line.from_sequence;
      if (this.keptError) return this.fail(at, this.keptError);
      const other = this.kept.find((k) => k.claim.chain !== line.chain);
      if (other) return this.fail(other.claim.sequence, `A checkpoint kept from earlier signs another chain than this export's (${other.claim.chain}).`);
      // What an export resumed past them cannot show.
      this.kept = this.kept.filter((k) => k.claim.sequence >= line.from_sequence);
      return true;
    }
    if (this.chain === null) return this.fail(at, 'The export does not start with its header line.');
    if (line.type === 'row') return this.row(line);
    if (line.type === 'checkpoint') return this.checkpoint(line);
    return this.fail(at, 'A line of an unknown type was found.');
  }

  /** A kept checkpoint before row `before` that the export did not list (its row went by without it), or null. */
  private keptNotListed(before: number): Kept | null {
    for (let k = this.kept[this.nextKept]; k && k.claim.sequence < before; k = this.kept[++this.nextKept]) if (!k.listed) return k;
    return null;
  }

  /** The kept checkpoint of row `sequence`, once those before it were passed. */
  private keptAt(sequence: number): Kept | undefined {
    const k = this.kept[this.nextKept];
    return k?.claim.sequence === sequence ? k : undefined;
  }

  private row(r: Extract<ExportLine, { type: 'row' }>): boolean {
    const expected = this.last ? this.last.sequence + 1 : this.from;
    const unlisted = this.keptNotListed(expected);
    if (unlisted) return this.fail(unlisted.claim.sequence, missingKept(unlisted.claim.sequence));
    if (!wellFormedRow(r)) return this.fail(expected, `The row line after row ${expected - 1} is malformed (a field is missing or of the wrong type).`);
    if (r.sequence !== expected) {
      if (r.sequence > expected)
        return this.fail(
          expected,
          r.sequence === expected + 1 ? `Row ${expected} is missing (deleted).` : `Rows ${expected} to ${r.sequence - 1} are missing (deleted).`,
        );
      return this.fail(r.sequence, `Row ${r.sequence} appears again or out of order after row ${expected - 1} (an inserted or reordered row).`);
    }
    const digest = rowDigest(r);
    if (r.hash !== linkHash({ chain: this.chain!, created_at: r.created_at, digest, prev_hash: r.prev_hash, sequence: r.sequence })) {
      return this.fail(r.sequence, `Row ${r.sequence} does not match its hash: a field or its place in the chain was changed.`);
    }
    if (this.last ? r.prev_hash !== this.last.hash : this.from === 1 && r.prev_hash !== GENESIS) {
      return this.fail(r.sequence, `Row ${r.sequence} does not follow row ${r.sequence - 1}: a row before it was changed, inserted or deleted.`);
    }
    const kept = this.keptAt(r.sequence);
    if (kept && kept.claim.hash !== r.hash)
      return this.fail(r.sequence, `Row ${r.sequence} is not the row its signed checkpoint covers: the chain up to it was rewritten.`);
    this.last = { sequence: r.sequence, hash: r.hash };
    this.first ??= r.sequence;
    this.rows++;
    return true;
  }

  private checkpoint(cp: Extract<ExportLine, { type: 'checkpoint' }>): boolean {
    if (typeof cp.jws !== 'string' || !Number.isSafeInteger(cp.sequence))
      return this.fail(this.last ? this.last.sequence : this.from, 'A checkpoint line is malformed.');
    const signed = verifyCheckpointJws(cp.jws, this.jwks);
    if ('error' in signed) return this.fail(cp.sequence, `The checkpoint of row ${cp.sequence} ${signed.error}.`);
    const { claim } = signed;
    if (claim.chain !== this.chain) return this.fail(claim.sequence, `The checkpoint of row ${claim.sequence} signs another account's chain.`);
    if (claim.sequence !== cp.sequence || claim.hash !== cp.hash)
      return this.fail(claim.sequence, `The checkpoint of row ${claim.sequence} says something else than its signature.`);
    if (this.last?.sequence !== claim.sequence)
      return this.fail(claim.sequence, `Row ${claim.sequence}, which a signed checkpoint covers, is missing (deleted).`);
    if (this.last.hash !== claim.hash)
      return this.fail(claim.sequence, `Row ${claim.sequence} is not the row its signed checkpoint covers: the chain up to it was rewritten.`);
    const broken = this.unlinked(claim);
    if (broken) return this.fail(claim.sequence, broken);
    const kept = this.keptAt(claim.sequence);
    if (kept) {
      if (kept.jws !== cp.jws) return this.fail(claim.sequence, `The checkpoint of row ${claim.sequence} is not the one kept from earlier: it was replaced.`);
      kept.listed = true;
    }
    this.lastCheckpoint = { sequence: claim.sequence, jws: cp.jws, chained: claim.prev !== undefined };
    this.anchored = claim.sequence;
    this.checkpoints++;
    return true;
  }

  /** Why `claim` does not follow the checkpoint before it in the export, or null when it does (or the export cannot show it). */
  private unlinked(claim: CheckpointClaim): string | null {
    const before = this.lastCheckpoint;
    const at = `The checkpoint of row ${claim.sequence}`;
    // Signed before checkpoints were chained: only a chain's earliest checkpoints can be such.
    if (claim.prev === undefined) return before?.chained ? `${at} is not linked to the checkpoint before it.` : null;
    if (before) {
      const link = checkpointLink(before);
      return claim.prev?.sequence === link.sequence && claim.prev.checkpoint === link.checkpoint
        ? null
        : `${at} does not follow the checkpoint of row ${before.sequence}: a checkpoint between them was deleted or replaced.`;
    }
    if (claim.prev && claim.prev.sequence >= this.from) return `${at} follows a checkpoint of row ${claim.prev.sequence}, which is missing (deleted).`;
    return null;
  }

  private fail(sequence: number, reason: string): false {
    this.broken = { sequence, reason };
    return false;
  }

  /** The last row that verified, and the last checkpoint (what a next checkpoint follows). */
  tip(): { row: { sequence: number; hash: string } | null; checkpoint: { sequence: number; jws: string } | null } {
    return { row: this.last, checkpoint: this.lastCheckpoint && { sequence: this.lastCheckpoint.sequence, jws: this.lastCheckpoint.jws } };
  }

  /** The outcome once every line was fed. */
  verdict(): Verdict {
    if (!this.broken && this.chain === null) this.fail(this.from, 'The export is empty: it has no header line.');
    if (!this.broken) {
      const lastSeq = this.last?.sequence ?? this.from - 1;
      const unlisted = this.keptNotListed(lastSeq + 1);
      const gone = this.kept[this.nextKept];
      if (unlisted) this.fail(unlisted.claim.sequence, missingKept(unlisted.claim.sequence));
      else if (gone) this.fail(gone.claim.sequence, `Row ${gone.claim.sequence}, which a signed checkpoint covers, is missing (deleted).`);
    }
    const lastSeq = this.last?.sequence ?? null;
    return {
      ok: !this.broken,
      chain: this.chain,
      rows: this.rows,
      checkpoints: this.checkpoints,
      first_sequence: this.first,
      last_sequence: lastSeq,
      last_checkpoint_sequence: this.anchored,
      unanchored_rows: lastSeq === null ? 0 : lastSeq - (this.anchored ?? (this.first ?? 1) - 1),
      first_break: this.broken,
    };
  }
}

const missingKept = (sequence: number) => `The checkpoint of row ${sequence}, kept from earlier, is missing from the export: it was deleted.`;
