import * as crypto from 'node:crypto';
import { generateRawKeyPair, privateKeyFromRaw, publicKeyFromRaw, rawPublicKey, type Curve } from '../../curve25519';

/**
 * Key material of the four public-key algorithms of v6 keys made and read here, in their native encodings
 * (no MPIs): X25519 (25) and Ed25519 (27) of RFC 9580 §5.5.5.7-8, and RFC 9980's composites
 * ML-KEM-768+X25519 (35) and ML-DSA-65+Ed25519 (30). A composite's public material is the elliptic-curve
 * key (32 octets) then the post-quantum one; its secret material is the elliptic-curve secret (32 octets)
 * then the post-quantum seed (FIPS 203's d ‖ z, 64 octets; FIPS 204's ξ, 32 octets), the form RFC 9980
 * stores and the one Node imports ('raw-seed'). Key pairs are random octets imported, never
 * `generateKeyPairSync` (see ../../curve25519.ts).
 */

export const X25519 = 25;
export const ED25519 = 27;
export const MLDSA65_ED25519 = 30;
export const MLKEM768_X25519 = 35;
export type V6Algorithm = typeof X25519 | typeof ED25519 | typeof MLDSA65_ED25519 | typeof MLKEM768_X25519;
export type SigningAlgorithm = typeof ED25519 | typeof MLDSA65_ED25519;

interface PostQuantum {
  type: 'ml-kem-768' | 'ml-dsa-65';
  publicBytes: number;
  seedBytes: number;
}

const SHAPE: Record<V6Algorithm, { curve: Curve; pq?: PostQuantum; signs: boolean }> = {
  [X25519]: { curve: 'x25519', signs: false },
  [ED25519]: { curve: 'ed25519', signs: true },
  [MLDSA65_ED25519]: { curve: 'ed25519', pq: { type: 'ml-dsa-65', publicBytes: 1952, seedBytes: 32 }, signs: true },
  [MLKEM768_X25519]: { curve: 'x25519', pq: { type: 'ml-kem-768', publicBytes: 1184, seedBytes: 64 }, signs: false },
};

export const isV6Algorithm = (n: number): n is V6Algorithm => n in SHAPE;
export const isSigningAlgorithm = (n: V6Algorithm): n is SigningAlgorithm => SHAPE[n].signs;
export const publicMaterialBytes = (alg: V6Algorithm): number => 32 + (SHAPE[alg].pq?.publicBytes ?? 0);
const secretMaterialBytes = (alg: V6Algorithm): number => 32 + (SHAPE[alg].pq?.seedBytes ?? 0);

export interface Material {
  publicMaterial: Buffer;
  secretMaterial: Buffer;
}

export function generateMaterial(alg: V6Algorithm): Material {
  const { curve, pq } = SHAPE[alg];
  const ecc = generateRawKeyPair(curve);
  if (!pq) return { publicMaterial: ecc.x, secretMaterial: ecc.d };
  const seed = crypto.randomBytes(pq.seedBytes);
  const pqPublic = crypto.createPublicKey(pqPrivate(pq, seed)).export({ format: 'raw-public' });
  return { publicMaterial: Buffer.concat([ecc.x, pqPublic]), secretMaterial: Buffer.concat([ecc.d, seed]) };
}

/** Node's keys of a public material: the elliptic-curve key (and its raw 32 octets, which the KEM combiner hashes), and the post-quantum key of a composite. */
export interface PublicParts {
  ecc: crypto.KeyObject;
  eccRaw: Buffer;
  pq: crypto.KeyObject | undefined;
}

export function publicParts(alg: V6Algorithm, publicMaterial: Buffer): PublicParts {
  const { curve, pq } = SHAPE[alg];
  if (publicMaterial.length !== publicMaterialBytes(alg)) throw new Error(`algorithm ${alg}: public key material of ${publicMaterial.length} octets`);
  const eccRaw = publicMaterial.subarray(0, 32);
  return {
    ecc: publicKeyFromRaw(curve, eccRaw),
    eccRaw,
    pq: pq && crypto.createPublicKey({ key: publicMaterial.subarray(32), format: 'raw-public', asymmetricKeyType: pq.type }),
  };
}

export interface PrivateParts {
  ecc: crypto.KeyObject;
  pq: crypto.KeyObject | undefined;
}

export function privateParts(alg: V6Algorithm, secretMaterial: Buffer): PrivateParts {
  const { curve, pq } = SHAPE[alg];
  if (secretMaterial.length !== secretMaterialBytes(alg)) throw new Error(`algorithm ${alg}: secret key material of ${secretMaterial.length} octets`);
  return { ecc: privateKeyFromRaw(curve, secretMaterial.subarray(0, 32)), pq: pq && pqPrivate(pq, secretMaterial.subarray(32)) };
}

/** Whether a secret material is that of a public material: both halves' public keys derived again and compared (no key overwriting). */
export function secretMatches(alg: V6Algorithm, publicMaterial: Buffer, secretMaterial: Buffer): boolean {
  const { curve, pq } = SHAPE[alg];
  if (publicMaterial.length !== publicMaterialBytes(alg) || secretMaterial.length !== secretMaterialBytes(alg)) return false;
  const parts = privateParts(alg, secretMaterial);
  const derived = [rawPublicKey(curve, parts.ecc), ...(pq && parts.pq ? [crypto.createPublicKey(parts.pq).export({ format: 'raw-public' })] : [])];
  return Buffer.concat(derived).equals(publicMaterial);
}

const pqPrivate = (pq: PostQuantum, seed: Buffer): crypto.KeyObject => crypto.createPrivateKey({ key: seed, format: 'raw-seed', asymmetricKeyType: pq.type });
