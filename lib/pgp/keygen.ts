import * as crypto from 'node:crypto';
import { generateRawKeyPair } from '../curve25519';
import { legacyPoint, packet } from './packets';

/**
 * Curve25519 keys (v4: an EdDSA primary key that certifies and signs, an ECDH subkey that encrypts; the
 * legacy algorithm ids, since gpg 2.2 cannot read RFC 9580's new Ed25519 and X25519 ones) made on Node's
 * crypto. OpenPGP.js spends several times more CPU a key (each Ed25519 signature through WebCrypto, with a
 * key import and a thread-pool hop), half of a warm rotation worker's CPU (docs/performance.md). The packets
 * are those OpenPGP.js wrote under keys.ts's settings (same subpackets, same lock), less the random salt
 * notation it adds against fault attacks on deterministic signatures: such an attack needs the same
 * message signed twice, and each message here is signed once. RSA keys are still made by OpenPGP.js.
 */

export interface Curve25519KeyInput {
  userId: string;
  /** Locks both secret keys (iterated and salted S2K, SHA-256, AES-256; see keys.ts, GENERATION_S2K_COUNT_BYTE). */
  secret: string;
  s2kCountByte: number;
  /** Whole seconds. */
  createdAt: Date;
  /** Seconds after creation; 0 for a key that does not expire. */
  expiresIn: number;
}

export interface Curve25519Key {
  fingerprint: string;
  keyId: string;
  subkeyId: string;
  /** Transferable public key: primary key, user id, certification, subkey, binding (binary packets). */
  publicPackets: Buffer;
  /** The same as a transferable secret key, both secrets locked with `secret`. */
  privatePackets: Buffer;
}

/** Algorithm ids (RFC 9580 §9), fixed by the format. */
const EDDSA_LEGACY = 22;
const ECDH = 18;
const SHA256 = 8;
const SHA512 = 10;
const AES128 = 7;
const AES256 = 9;
/** OIDs of Ed25519Legacy and Curve25519Legacy (RFC 9580 §9.2), with their length octet. */
const ED25519_OID = Buffer.from('092b06010401da470f01', 'hex');
const CV25519_OID = Buffer.from('0a2b060104019755010501', 'hex');

/** Packet tags (RFC 9580 §5). */
const TAG = { signature: 2, secretKey: 5, secretSubkey: 7, publicKey: 6, userId: 13, publicSubkey: 14 } as const;
/** Signature types and subpacket types (RFC 9580 §5.2.1, §5.2.3.7). */
const POSITIVE_CERTIFICATION = 0x13;
const SUBKEY_BINDING = 0x18;
const SUB = {
  created: 2,
  keyExpires: 9,
  prefSymmetric: 11,
  issuerKeyId: 16,
  prefHash: 21,
  prefCompression: 22,
  primaryUserId: 25,
  keyFlags: 27,
  features: 30,
  issuerFingerprint: 33,
} as const;
const CRITICAL = 0x80;

export function curve25519Key(input: Curve25519KeyInput): Curve25519Key {
  const created = u32(input.createdAt.getTime() / 1000);

  const ed = generateRawKeyPair('ed25519');
  const primary = Buffer.concat([Buffer.from([4]), created, Buffer.from([EDDSA_LEGACY]), ED25519_OID, legacyPoint(ed.x)]);

  const cv = generateRawKeyPair('x25519');
  const kdf = Buffer.from([3, 1, SHA256, AES128]);
  const subkey = Buffer.concat([Buffer.from([4]), created, Buffer.from([ECDH]), CV25519_OID, legacyPoint(cv.x), kdf]);

  const fingerprint = crypto.createHash('sha1').update(keyHashPrefix(primary)).update(primary).digest();
  const subkeyFingerprint = crypto.createHash('sha1').update(keyHashPrefix(subkey)).update(subkey).digest();
  const issuerKeyId = subpacket(SUB.issuerKeyId, fingerprint.subarray(12));
  const issuerFingerprint = subpacket(SUB.issuerFingerprint, Buffer.concat([Buffer.from([4]), fingerprint]));
  const validity = [subpacket(SUB.created | CRITICAL, created), ...(input.expiresIn ? [subpacket(SUB.keyExpires | CRITICAL, u32(input.expiresIn))] : [])];

  const userId = Buffer.from(input.userId, 'utf8');
  const certification = sign(
    ed.privateKey,
    POSITIVE_CERTIFICATION,
    [
      ...validity,
      subpacket(SUB.prefSymmetric, Buffer.from([AES256, AES128])),
      issuerKeyId,
      subpacket(SUB.prefHash, Buffer.from([SHA512, SHA256, 14, 12])), // then SHA3-512, SHA3-256
      subpacket(SUB.prefCompression, Buffer.from([0, 2, 1])), // uncompressed, zlib, zip
      subpacket(SUB.primaryUserId, Buffer.from([1])),
      subpacket(SUB.keyFlags | CRITICAL, Buffer.from([0x03])), // certify, sign
      subpacket(SUB.features, Buffer.from([0x01])), // MDC (no SEIPDv2: keys.ts)
      issuerFingerprint,
    ],
    [keyHashPrefix(primary), primary, Buffer.from([0xb4]), u32(userId.length), userId],
  );
  const binding = sign(
    ed.privateKey,
    SUBKEY_BINDING,
    [
      ...validity,
      issuerKeyId,
      subpacket(SUB.keyFlags | CRITICAL, Buffer.from([0x0c])), // encrypt communications and storage
      issuerFingerprint,
    ],
    [keyHashPrefix(primary), primary, keyHashPrefix(subkey), subkey],
  );

  // OpenPGP keeps the X25519 scalar big-endian, clamped (RFC 9580 §5.5.5.6.1; generateRawKeyPair clamps); EdDSA its 32-octet seed.
  const edSecret = mpi(ed.d);
  const cvSecret = mpi(Buffer.from(cv.d).reverse());

  const uid = packet(TAG.userId, userId);
  const certPacket = packet(TAG.signature, certification);
  const bindingPacket = packet(TAG.signature, binding);
  return {
    fingerprint: fingerprint.toString('hex'),
    keyId: fingerprint.subarray(12).toString('hex'),
    subkeyId: subkeyFingerprint.subarray(12).toString('hex'),
    publicPackets: Buffer.concat([packet(TAG.publicKey, primary), uid, certPacket, packet(TAG.publicSubkey, subkey), bindingPacket]),
    privatePackets: Buffer.concat([
      packet(TAG.secretKey, Buffer.concat([primary, locked(edSecret, input)])),
      uid,
      certPacket,
      packet(TAG.secretSubkey, Buffer.concat([subkey, locked(cvSecret, input)])),
      bindingPacket,
    ]),
  };
}

/**
 * A v4 signature (RFC 9580 §5.2.3) by the EdDSA key over `signed` and its own hashed part, SHA-512.
 * Legacy EdDSA signs the digest; R and S go out as MPIs.
 */
function sign(key: crypto.KeyObject, type: number, hashed: Buffer[], signed: Buffer[]): Buffer {
  const area = Buffer.concat(hashed);
  const head = Buffer.concat([Buffer.from([4, type, EDDSA_LEGACY, SHA512]), u16(area.length), area]);
  const hash = crypto.createHash('sha512');
  for (const part of signed) hash.update(part);
  const digest = hash
    .update(head)
    .update(Buffer.from([4, 0xff]))
    .update(u32(head.length))
    .digest();
  const rs = crypto.sign(null, digest, key);
  return Buffer.concat([head, u16(0), digest.subarray(0, 2), mpi(rs.subarray(0, 32)), mpi(rs.subarray(32))]);
}

/**
 * A secret key's lock (RFC 9580 §5.5.3, usage 254): AES-256 in CFB under an iterated and salted
 * SHA-256 S2K of `secret`, over the secret MPIs and their SHA-1.
 */
function locked(secretMpis: Buffer, input: Curve25519KeyInput): Buffer {
  const salt = crypto.randomBytes(8);
  const iv = crypto.randomBytes(16);
  const c = input.s2kCountByte;
  const count = (16 + (c & 15)) << ((c >> 4) + 6);
  const salted = Buffer.concat([salt, Buffer.from(input.secret, 'utf8')]);
  const hash = crypto.createHash('sha256');
  // Hashes `count` octets of salt ‖ secret repeated, and all of it once at least.
  for (let left = Math.max(count, salted.length); left > 0; left -= salted.length) hash.update(salted.subarray(0, Math.min(left, salted.length)));
  const cipher = crypto.createCipheriv('aes-256-cfb', hash.digest(), iv);
  const checked = Buffer.concat([secretMpis, crypto.createHash('sha1').update(secretMpis).digest()]);
  return Buffer.concat([Buffer.from([254, AES256, 3, SHA256]), salt, Buffer.from([c]), iv, cipher.update(checked), cipher.final()]);
}

/** An MPI (RFC 9580 §3.2): the bit count, then the octets without leading zero octets. */
function mpi(bytes: Buffer): Buffer {
  let i = 0;
  while (i < bytes.length && bytes[i] === 0) i++;
  const rest = bytes.subarray(i);
  const bits = rest.length ? (rest.length - 1) * 8 + (32 - Math.clz32(rest[0])) : 0;
  return Buffer.concat([u16(bits), rest]);
}

/** What a key packet's body is hashed after, in fingerprints and signatures (v4). */
const keyHashPrefix = (body: Buffer): Buffer => Buffer.concat([Buffer.from([0x99]), u16(body.length)]);

/** A signature subpacket; every one here is shorter than 192 octets. */
const subpacket = (type: number, data: Buffer): Buffer => Buffer.concat([Buffer.from([data.length + 1, type]), data]);

function u16(n: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(n);
  return b;
}

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
}
