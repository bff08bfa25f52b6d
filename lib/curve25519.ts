import { createPrivateKey, createPublicKey, randomBytes, type KeyObject } from 'node:crypto';

/**
 * X25519 and Ed25519 keys to and from their raw 32 octets (RFC 7748, RFC 8032), the form OpenPGP packets
 * and the lineage lock keep. New key pairs are 32 random octets imported, never `generateKeyPairSync`:
 * in Node 20 the job object that call leaves behind takes the key's lock in its destructor, which the
 * garbage collector runs, and a JWK export holds that same lock while it allocates. A collection that
 * falls inside such an export deadlocks the process for good: it froze rotation workers mid-transaction.
 * `generateKeyPairSync(c).privateKey.export({ format: 'jwk' })`
 * in a loop with a 1 MiB young generation hung within 60k rounds in four runs of four. Imported keys have
 * no such job. JWK is Node's raw-key path (DER goes through OpenSSL's decoders, which cost more).
 */
export type Curve = 'x25519' | 'ed25519';

const CRV: Record<Curve, string> = { x25519: 'X25519', ed25519: 'Ed25519' };
const b64u = (bytes: Uint8Array) => Buffer.from(bytes).toString('base64url');

export interface RawKeyPair {
  privateKey: KeyObject;
  publicKey: KeyObject;
  /** The private key: Ed25519's seed, or X25519's scalar (little-endian, clamped as OpenSSL's generator does). */
  d: Buffer;
  /** The public key. */
  x: Buffer;
}

export function generateRawKeyPair(curve: Curve): RawKeyPair {
  const d = randomBytes(32);
  if (curve === 'x25519') {
    d[0] &= 248;
    d[31] = (d[31] & 127) | 64;
  }
  const privateKey = privateKeyFromRaw(curve, d);
  const publicKey = createPublicKey(privateKey);
  return { privateKey, publicKey, d, x: rawPublicKey(curve, publicKey) };
}

export function privateKeyFromRaw(curve: Curve, d: Uint8Array): KeyObject {
  if (d.length !== 32) throw new Error(`${curve} private key: ${d.length} octets, not 32`);
  // Node imports an OKP private key from `d` alone (deriving the public half); `x` must be a string and is not read.
  return createPrivateKey({ key: { kty: 'OKP', crv: CRV[curve], d: b64u(d), x: '' }, format: 'jwk' });
}

export function publicKeyFromRaw(curve: Curve, x: Uint8Array): KeyObject {
  if (x.length !== 32) throw new Error(`${curve} public key: ${x.length} octets, not 32`);
  return createPublicKey({ key: { kty: 'OKP', crv: CRV[curve], x: b64u(x) }, format: 'jwk' });
}

/** The raw public key of a public key, or of a private key's public half. */
export function rawPublicKey(curve: Curve, key: KeyObject): Buffer {
  const jwk = (key.type === 'private' ? createPublicKey(key) : key).export({ format: 'jwk' });
  const x = Buffer.from(jwk.x ?? '', 'base64url');
  if (jwk.crv !== CRV[curve] || x.length !== 32) throw new Error(`not an ${curve} key`);
  return x;
}
