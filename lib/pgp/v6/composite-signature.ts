import * as crypto from 'node:crypto';
import { MLDSA65_ED25519, type PrivateParts, type PublicParts, type SigningAlgorithm } from './key-material';

/**
 * The algorithm-specific fields of v6 signatures by the two signing algorithms here, over the signature's
 * digest (the hash of salt, data and trailer): Ed25519 (RFC 9580 §5.2.3.4) is its 64-octet signature of
 * the digest; ML-DSA-65+Ed25519 (RFC 9980) is the Ed25519 signature then the ML-DSA-65 signature
 * (3309 octets, FIPS 204 ML-DSA.Sign with the empty context, Node's default, hedged) of the same
 * digest, and holds only when both do.
 */

const ED25519_SIGNATURE_BYTES = 64;
const MLDSA65_SIGNATURE_BYTES = 3309;

export const signatureMaterialBytes = (alg: SigningAlgorithm): number => ED25519_SIGNATURE_BYTES + (alg === MLDSA65_ED25519 ? MLDSA65_SIGNATURE_BYTES : 0);

export function signDigest(alg: SigningAlgorithm, key: PrivateParts, digest: Buffer): Buffer {
  const ecc = crypto.sign(null, digest, key.ecc);
  if (alg !== MLDSA65_ED25519) return ecc;
  if (!key.pq) throw new Error('a composite signing key without its ML-DSA half');
  return Buffer.concat([ecc, crypto.sign(null, digest, key.pq)]);
}

export function verifyDigest(alg: SigningAlgorithm, key: PublicParts, digest: Buffer, material: Buffer): boolean {
  if (material.length !== signatureMaterialBytes(alg)) return false;
  const eccValid = verifies(digest, key.ecc, material.subarray(0, ED25519_SIGNATURE_BYTES));
  if (alg !== MLDSA65_ED25519) return eccValid;
  // Both halves are checked whatever the first says: the time taken does not tell which one failed.
  const pqValid = !!key.pq && verifies(digest, key.pq, material.subarray(ED25519_SIGNATURE_BYTES));
  return eccValid && pqValid;
}

/** A signature that Node cannot even check (a malformed point) is a signature that does not verify. */
function verifies(digest: Buffer, key: crypto.KeyObject, signature: Buffer): boolean {
  try {
    return crypto.verify(null, digest, key, signature);
  } catch {
    return false;
  }
}
