import * as crypto from 'node:crypto';
import { signatureMaterialBytes, signDigest, verifyDigest } from './composite-signature';
import { isSigningAlgorithm, isV6Algorithm, type PrivateParts, type PublicParts, type SigningAlgorithm, type V6Algorithm } from './key-material';
import { Cursor, subpackets, u32, type Subpacket } from './wire';

/** Version 6 key packets and signature packets (RFC 9580 §5.5.2.3, §5.2.3), written and read. */

/** Packet tags (RFC 9580 §5). */
export const TAG = { pkesk: 1, signature: 2, secretKey: 5, publicKey: 6, secretSubkey: 7, trust: 12, userId: 13, publicSubkey: 14 } as const;

/** Signature types (RFC 9580 §5.2.1). */
export const SIG = {
  binary: 0x00,
  genericCertification: 0x10,
  positiveCertification: 0x13,
  subkeyBinding: 0x18,
  primaryKeyBinding: 0x19,
  directKey: 0x1f,
  keyRevocation: 0x20,
  subkeyRevocation: 0x28,
  certificationRevocation: 0x30,
} as const;

/** Signature subpacket types (RFC 9580 §5.2.3.7) read or written here. */
export const SUB = {
  created: 2,
  sigExpires: 3,
  keyExpires: 9,
  prefSymmetric: 11,
  issuerKeyId: 16,
  notation: 20,
  prefHash: 21,
  prefCompression: 22,
  primaryUserId: 25,
  keyFlags: 27,
  reasonForRevocation: 29,
  features: 30,
  embeddedSignature: 32,
  issuerFingerprint: 33,
  prefAead: 39,
} as const;
/** Key flags (RFC 9580 §5.2.3.29): sign; certify and sign; encrypt communications and storage. */
export const KEY_FLAGS = { sign: 0x02, certifySign: 0x03, encrypt: 0x0c } as const;

const KNOWN_SUBPACKETS = new Set<number>([...Object.values(SUB), 4, 5, 6, 7, 10, 12, 23, 24, 26, 28, 31, 34, 35, 37, 38]);

/**
 * Hash algorithms a v6 signature may use here, with the salt size RFC 9580 §9.5 fixes for each. Ed25519
 * and ML-DSA-65 signatures need a digest of at least 256 bits (RFC 9580 §5.2.3.4, RFC 9980), so SHA-224
 * is left out, and MD5, SHA-1 and RIPEMD-160 are never read in v6 signatures.
 */
const HASHES: Record<number, { name: string; saltBytes: number }> = {
  8: { name: 'sha256', saltBytes: 16 },
  9: { name: 'sha384', saltBytes: 24 },
  10: { name: 'sha512', saltBytes: 32 },
  12: { name: 'sha3-256', saltBytes: 16 },
  14: { name: 'sha3-512', saltBytes: 32 },
};
export const SHA512 = 10;

// ---------------------------------------------------------------------------------------- keys

/** A v6 key packet's public part: version, creation time, algorithm, the material's length, the material. */
export const keyBody = (created: number, alg: V6Algorithm, publicMaterial: Buffer): Buffer =>
  Buffer.concat([Buffer.from([6]), u32(created), Buffer.from([alg]), u32(publicMaterial.length), publicMaterial]);

/** How a v6 key is hashed into fingerprints and signatures: 0x9B, its four-octet length, its body. */
export const keyHashed = (body: Buffer): Buffer => Buffer.concat([Buffer.from([0x9b]), u32(body.length), body]);

/** The v6 fingerprint (RFC 9580 §5.5.4.3): SHA-256 of the key as hashed. Its first 8 octets are the key id. */
export const fingerprintOf = (body: Buffer): Buffer => crypto.createHash('sha256').update(keyHashed(body)).digest();

/** A user id as hashed into a certification: 0xB4, its four-octet length, its octets. */
export const userIdHashed = (userId: Buffer): Buffer => Buffer.concat([Buffer.from([0xb4]), u32(userId.length), userId]);

export interface KeyPacketFields {
  algorithm: V6Algorithm;
  created: number;
  publicMaterial: Buffer;
  /** The public part of the packet, as hashed and fingerprinted. */
  publicBody: Buffer;
  /** A secret key packet's secret part (S2K usage onwards), unparsed; empty for a public key packet. */
  secretPart: Buffer;
}

/** Reads a v6 public or secret key packet's body; the material has its algorithm's exact size. */
export function readKeyPacket(body: Buffer, secret: boolean, fail: (why: string) => Error, size: (alg: V6Algorithm) => number): KeyPacketFields {
  const c = new Cursor(body, fail);
  const version = c.u8();
  if (version !== 6) throw fail(`a version ${version} key packet (only version 6 is read here)`);
  const created = c.u32();
  const algorithm = c.u8();
  if (!isV6Algorithm(algorithm)) throw fail(`public-key algorithm ${algorithm} (read here: 25, 27, 30, 35)`);
  const length = c.u32();
  if (length !== size(algorithm)) throw fail(`algorithm ${algorithm} key material of ${length} octets, not ${size(algorithm)}`);
  const publicMaterial = c.bytes(length);
  const publicBody = body.subarray(0, body.length - c.left);
  const secretPart = c.rest();
  if (!secret && secretPart.length) throw fail(`${secretPart.length} octets after a public key's material`);
  if (secret && !secretPart.length) throw fail('a secret key packet without its secret part');
  return { algorithm, created, publicMaterial, publicBody, secretPart };
}

// ---------------------------------------------------------------------------------------- signatures

export interface SignerKey {
  algorithm: SigningAlgorithm;
  parts: PrivateParts;
}

/** A signature being made: its hash has taken the salt; the signed data goes in next, then `finishSignature`. */
export interface SignatureDraft {
  head: Buffer;
  salt: Buffer;
  hash: crypto.Hash;
}

/** Starts a v6 signature (salt from the CSPRNG, of the size its hash requires) whose hashed area is `hashed`. */
export function draftSignature(algorithm: SigningAlgorithm, type: number, hashAlgorithm: number, hashed: Buffer[]): SignatureDraft {
  const h = HASHES[hashAlgorithm];
  const area = Buffer.concat(hashed);
  const head = Buffer.concat([Buffer.from([6, type, algorithm, hashAlgorithm]), u32(area.length), area]);
  const salt = crypto.randomBytes(h.saltBytes);
  return { head, salt, hash: crypto.createHash(h.name).update(salt) };
}

/** The signature packet's body: head, an empty unhashed area, the digest's first two octets, the salt, the signature. */
export function finishSignature(draft: SignatureDraft, key: SignerKey): Buffer {
  const digest = trailed(draft.hash, draft.head);
  return Buffer.concat([draft.head, u32(0), digest.subarray(0, 2), Buffer.from([draft.salt.length]), draft.salt, signDigest(key.algorithm, key.parts, digest)]);
}

/** A v6 signature by `key` over `signed` (key and user id packets as hashed). */
export function signParts(key: SignerKey, type: number, hashed: Buffer[], signed: Buffer[]): Buffer {
  const draft = draftSignature(key.algorithm, type, SHA512, hashed);
  for (const part of signed) draft.hash.update(part);
  return finishSignature(draft, key);
}

export interface V6Signature {
  type: number;
  algorithm: SigningAlgorithm;
  hashAlgorithm: number;
  hashed: Subpacket[];
  unhashed: Subpacket[];
  /** Version to the end of the hashed area: what the trailer hashes again. */
  head: Buffer;
  left16: Buffer;
  salt: Buffer;
  material: Buffer;
  /** The hashed creation time, in seconds; a signature without one is invalid (RFC 9580 §5.2.3.11). */
  created: number | undefined;
  /** The hashed or unhashed issuer fingerprint's 32 octets, when it names a v6 key. */
  issuerFingerprint: Buffer | undefined;
  /** A hashed subpacket marked critical that is not known here: the signature must be taken as invalid (RFC 9580 §5.2.3.7). */
  unknownCritical: boolean;
}

export function readSignature(body: Buffer, fail: (why: string) => Error): V6Signature {
  const c = new Cursor(body, fail);
  const version = c.u8();
  if (version !== 6) throw fail(`a version ${version} signature (only version 6 is read here)`);
  const type = c.u8();
  const algorithm = c.u8();
  const hashAlgorithm = c.u8();
  if (!isV6Algorithm(algorithm) || !isSigningAlgorithm(algorithm)) throw fail(`a signature of public-key algorithm ${algorithm} (read here: 27, 30)`);
  const hash = HASHES[hashAlgorithm];
  if (!hash) throw fail(`a signature with hash algorithm ${hashAlgorithm} (read here: 8, 9, 10, 12, 14)`);
  const hashedArea = c.bytes(c.u32());
  const head = body.subarray(0, body.length - c.left);
  const unhashedArea = c.bytes(c.u32());
  const left16 = c.bytes(2);
  const saltBytes = c.u8();
  if (saltBytes !== hash.saltBytes) throw fail(`a salt of ${saltBytes} octets with hash algorithm ${hashAlgorithm} (which takes ${hash.saltBytes})`);
  const salt = c.bytes(saltBytes);
  const material = c.rest();
  if (material.length !== signatureMaterialBytes(algorithm)) throw fail(`an algorithm ${algorithm} signature of ${material.length} octets`);
  const hashed = subpackets(hashedArea, fail);
  const unhashed = subpackets(unhashedArea, fail);
  const createdSub = hashed.find((s) => s.type === SUB.created && s.data.length === 4);
  const issuer = [...hashed, ...unhashed].find((s) => s.type === SUB.issuerFingerprint && s.data.length === 33 && s.data[0] === 6);
  return {
    type,
    algorithm,
    hashAlgorithm,
    hashed,
    unhashed,
    head,
    left16,
    salt,
    material,
    created: createdSub?.data.readUInt32BE(0),
    issuerFingerprint: issuer?.data.subarray(1),
    unknownCritical: hashed.some((s) => s.critical && !KNOWN_SUBPACKETS.has(s.type)),
  };
}

/** The hash a v6 signature covers, with its salt taken: the signed data goes in next, then `verifySignature`. */
export const signatureHash = (sig: V6Signature): crypto.Hash => crypto.createHash(HASHES[sig.hashAlgorithm].name).update(sig.salt);

/** Whether `sig` is `key`'s signature over what `hash` took (after the salt). */
export function verifySignature(sig: V6Signature, hash: crypto.Hash, key: PublicParts): boolean {
  if (sig.unknownCritical || sig.created === undefined) return false;
  const digest = trailed(hash, sig.head);
  // The digest's first two octets (left16) are a hint only (RFC 9580 §5.2.3): the signature decides.
  return verifyDigest(sig.algorithm, key, digest, sig.material);
}

/** A v6 signature over `signed` parts (key and user id packets as hashed), checked by `key`. */
export function verifyParts(sig: V6Signature, signed: Buffer[], key: PublicParts): boolean {
  const hash = signatureHash(sig);
  for (const part of signed) hash.update(part);
  return verifySignature(sig, hash, key);
}

/** The v6 trailer (RFC 9580 §5.2.4): the head again, then 0x06 0xFF and the head's four-octet length. */
const trailed = (hash: crypto.Hash, head: Buffer): Buffer =>
  hash
    .update(head)
    .update(Buffer.from([6, 0xff]))
    .update(u32(head.length))
    .digest();
