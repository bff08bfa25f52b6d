import { packet } from '../packets';
import { ED25519, generateMaterial, MLDSA65_ED25519, MLKEM768_X25519, privateParts, X25519, type SigningAlgorithm, type V6Algorithm } from './key-material';
import { lockMaterial } from './lock';
import { KEY_FLAGS, fingerprintOf, keyBody, keyHashed, SIG, signParts, SUB, TAG, userIdHashed, type SignerKey } from './packets-v6';
import { subpacket, u32 } from './wire';

/**
 * Version 6 keys (RFC 9580) made on Node's crypto, for two profiles: `rfc9580`, an Ed25519 primary key
 * (certify, sign) and an X25519 subkey (encrypt), which upstream OpenPGP.js reads too; and `pqc`, an
 * ML-DSA-65+Ed25519 primary key and an ML-KEM-768+X25519 subkey (RFC 9980), which Proton's OpenPGP.js
 * reads and upstream cannot. The packets are laid out as RFC 9580 §10.1 and Proton's v6 keys have them:
 * primary key, direct-key signature carrying the key's flags, features and preferences (what a v6 key's
 * properties are read from, §5.2.3.10), user id with its positive certification (primary user id),
 * subkey with its binding. Every signature is v6 with SHA-512 (a salt of 32 octets): RFC 9980 asks a
 * digest of at least 256 bits of an ML-DSA-65 signature, and Proton signs these keys with SHA-512 too.
 * gpg 2.2 reads none of it.
 */

export type V6Profile = 'rfc9580' | 'pqc';

export interface V6KeyInput {
  profile: V6Profile;
  userId: string;
  /** Locks both secret keys (S2K usage 253, AES-256-OCB; see lock.ts). */
  secret: string;
  s2kCountByte: number;
  /** Whole seconds. */
  createdAt: Date;
  /** Seconds after creation; 0 for a key that does not expire. */
  expiresIn: number;
}

export interface GeneratedV6Key {
  /** 64 lowercase hex digits: the v6 fingerprint, SHA-256. */
  fingerprint: string;
  /** 16 lowercase hex digits: the first 8 octets of the fingerprint (RFC 9580 §5.5.4.3). */
  keyId: string;
  subkeyId: string;
  subkeyFingerprint: string;
  /** Transferable public key (binary packets). */
  publicPackets: Buffer;
  /** The same as a transferable secret key, both secrets locked with `secret`. */
  privatePackets: Buffer;
}

const PROFILES: Record<V6Profile, { primary: SigningAlgorithm; subkey: V6Algorithm }> = {
  rfc9580: { primary: ED25519, subkey: X25519 },
  pqc: { primary: MLDSA65_ED25519, subkey: MLKEM768_X25519 },
};

const AES128 = 7;
const AES256 = 9;
const OCB = 2;
const GCM = 3;
const CRITICAL = 0x80;
/** Features (RFC 9580 §5.2.3.32): SEIPD v1 and v2. */
const SEIPD_V1_V2 = 0x09;

export function v6Key(input: V6KeyInput): GeneratedV6Key {
  const profile = PROFILES[input.profile];
  if (!profile) throw new Error(`unknown v6 key profile ${String(input.profile)}`);
  const created = Math.floor(input.createdAt.getTime() / 1000);

  const primaryMaterial = generateMaterial(profile.primary);
  const primary = keyBody(created, profile.primary, primaryMaterial.publicMaterial);
  const subkeyMaterial = generateMaterial(profile.subkey);
  const subkey = keyBody(created, profile.subkey, subkeyMaterial.publicMaterial);
  const fingerprint = fingerprintOf(primary);
  const subkeyFingerprint = fingerprintOf(subkey);
  const signer: SignerKey = { algorithm: profile.primary, parts: privateParts(profile.primary, primaryMaterial.secretMaterial) };

  const issuer = subpacket(SUB.issuerFingerprint, Buffer.concat([Buffer.from([6]), fingerprint]));
  const validity = [subpacket(SUB.created | CRITICAL, u32(created)), ...(input.expiresIn ? [subpacket(SUB.keyExpires | CRITICAL, u32(input.expiresIn))] : [])];
  const directKey = signParts(
    signer,
    SIG.directKey,
    [
      ...validity,
      subpacket(SUB.keyFlags | CRITICAL, Buffer.from([KEY_FLAGS.certifySign])),
      subpacket(SUB.features, Buffer.from([SEIPD_V1_V2])),
      subpacket(SUB.prefSymmetric, Buffer.from([AES256, AES128])),
      // GCM first: a sender picks the first suite it has, and OpenPGP.js runs GCM at ~80 times its OCB
      // speed (NOTES.md); OCB, every implementation's, stays second for the others.
      subpacket(SUB.prefAead, Buffer.from([AES256, GCM, AES256, OCB])),
      subpacket(SUB.prefHash, Buffer.from([10, 14, 8, 12])), // SHA-512, SHA3-512, SHA-256, SHA3-256
      subpacket(SUB.prefCompression, Buffer.from([0, 2])), // uncompressed, zlib
      issuer,
    ],
    [keyHashed(primary)],
  );
  const userId = Buffer.from(input.userId, 'utf8');
  const certification = signParts(
    signer,
    SIG.positiveCertification,
    [...validity, subpacket(SUB.primaryUserId, Buffer.from([1])), issuer],
    [keyHashed(primary), userIdHashed(userId)],
  );
  const binding = signParts(
    signer,
    SIG.subkeyBinding,
    [...validity, subpacket(SUB.keyFlags | CRITICAL, Buffer.from([KEY_FLAGS.encrypt])), issuer],
    [keyHashed(primary), keyHashed(subkey)],
  );

  const signatures = {
    direct: packet(TAG.signature, directKey),
    uid: Buffer.concat([packet(TAG.userId, userId), packet(TAG.signature, certification)]),
    binding: packet(TAG.signature, binding),
  };
  const lock = (tag: number, body: Buffer, material: Buffer) => Buffer.concat([body, lockMaterial(tag, body, material, input.secret, input.s2kCountByte)]);
  return {
    fingerprint: fingerprint.toString('hex'),
    keyId: fingerprint.subarray(0, 8).toString('hex'),
    subkeyId: subkeyFingerprint.subarray(0, 8).toString('hex'),
    subkeyFingerprint: subkeyFingerprint.toString('hex'),
    publicPackets: Buffer.concat([packet(TAG.publicKey, primary), signatures.direct, signatures.uid, packet(TAG.publicSubkey, subkey), signatures.binding]),
    privatePackets: Buffer.concat([
      packet(TAG.secretKey, lock(TAG.secretKey, primary, primaryMaterial.secretMaterial)),
      signatures.direct,
      signatures.uid,
      packet(TAG.secretSubkey, lock(TAG.secretSubkey, subkey, subkeyMaterial.secretMaterial)),
      signatures.binding,
    ]),
  };
}
