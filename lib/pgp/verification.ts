import type * as openpgp from 'openpgp';

/** The shapes of a signature verification, shared by the streams that check them (stream.ts, signatures.ts). */

/** A key that may have made a signature, with the fingerprint it is reported under (its generation's). */
export interface VerificationKey {
  key: openpgp.PublicKey;
  fingerprint: string;
}

export type SignatureProblem = 'bad_signature' | 'unknown_signer' | 'signer_key_expired' | 'signer_key_revoked' | 'weak_hash' | 'unsigned';

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
