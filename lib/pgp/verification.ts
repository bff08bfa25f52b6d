import type * as openpgp from 'openpgp';
import { isPqcKey, type StoredPublicKey } from './keys';
import { errMessage } from './thrown';

/** Signature verification: its shapes and the verdict over a message's signatures (stream.ts, signatures.ts). */

/** A key that may have made a signature, with the fingerprint it is reported under (its generation's). */
export interface VerificationKey {
  /** A post-quantum key (RFC 9980) is verified with by v6/detached.ts; any other by OpenPGP.js. */
  key: StoredPublicKey;
  fingerprint: string;
}

/** The keys OpenPGP.js verifies with: all but the post-quantum ones, which it cannot read. */
export const openpgpKeys = (keys: VerificationKey[]): openpgp.PublicKey[] => keys.flatMap((k) => (isPqcKey(k.key) ? [] : [k.key]));

type SignatureProblem = 'bad_signature' | 'unknown_signer' | 'signer_key_expired' | 'signer_key_revoked' | 'weak_hash' | 'unsigned';

/** What a verification found, per file (the job result's shape). */
export interface SignatureCheck {
  valid: boolean;
  /** The generation whose key made the signature (null when no known key did). */
  signer_fingerprint: string | null;
  signed_at: string | null;
  reason: SignatureProblem | null;
}

/** One signature of a verified message (OpenPGP.js's type, which its declarations do not export). */
export type VerificationResult = Awaited<ReturnType<typeof openpgp.verify>>['signatures'][number];

/** The verdict on a message without signatures. */
export const UNSIGNED: SignatureCheck = { valid: false, signer_fingerprint: null, signed_at: null, reason: 'unsigned' };

/**
 * The verdict over a message's signatures: valid when one by a known key verifies (reported: that one);
 * otherwise the first failure, in the words of SignatureProblem.
 */
export async function judge(signatures: VerificationResult[], keys: VerificationKey[]): Promise<SignatureCheck> {
  if (signatures.length === 0) return UNSIGNED;
  let first: SignatureCheck | undefined;
  for (const s of signatures) {
    const signer = keys.find((k) => !isPqcKey(k.key) && k.key.getKeys(s.keyID).length > 0);
    let signedAt: string | null = null;
    try {
      const packet = (await s.signature).packets[0];
      signedAt = packet?.created ? packet.created.toISOString() : null;
    } catch {
      /* unreadable: reported as a bad signature below */
    }
    const base = { signer_fingerprint: signer?.fingerprint ?? null, signed_at: signedAt };
    try {
      await s.verified;
      if (signer) return { ...base, valid: true, reason: null };
      first ??= { ...base, valid: false, reason: 'unknown_signer' };
    } catch (err) {
      first ??= { ...base, valid: false, reason: signer ? problem(err) : 'unknown_signer' };
    }
  }
  return first!;
}

function problem(err: unknown): SignatureProblem {
  const text = errMessage(err);
  if (/revoked/i.test(text)) return 'signer_key_revoked';
  if (/expired/i.test(text)) return 'signer_key_expired';
  if (/hash algorithm|insecure/i.test(text)) return 'weak_hash';
  if (/could not find signing key/i.test(text)) return 'unknown_signer';
  return 'bad_signature';
}
