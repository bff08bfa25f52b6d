import * as crypto from 'node:crypto';
import * as openpgp from 'openpgp';
import { generateRawKeyPair, privateKeyFromRaw, publicKeyFromRaw } from '../curve25519';
import { legacyPoint, packet } from './packets';

/**
 * Public-key encrypted session key packets (RFC 9580 §5.1) made and opened on Node's X25519: v3 ones for
 * ECDH on Curve25519 (the keys we make, and gpg's default), with the RFC 9580 §11.5 KDF and AES key wrap;
 * v3 and v6 ones for X25519 keys (algorithm 25, RFC 9580 §5.1.6), with HKDF-SHA256 and AES-128 key wrap.
 * OpenPGP.js does the same through WebCrypto, a thread-pool round trip per step, at about three times the
 * CPU a message (docs/performance.md). OpenPGP.js still picks and checks the keys, and handles every
 * other kind of key and packet.
 */

/** The key id a session key packet gives for a hidden recipient ("wildcard", RFC 9580 §5.1). */
export const WILDCARD_KEY_ID = '0000000000000000';

/** The AEAD modes of the SEIPDv2 messages written here (RFC 9580 §9.6): OCB, which every implementation has, and GCM. */
export type Aead = 'ocb' | 'gcm';

/** A session key a packet opened: v3 packets name its cipher; v6 ones leave it to the SEIPDv2 packet (`null`). */
export interface OpenedSessionKey {
  data: Uint8Array;
  algorithm: openpgp.enums.symmetricNames | null;
}

/**
 * The packet of a message to `recipient`, framed: v3 for a SEIPDv1 message, v6 for a SEIPDv2 message
 * (`aead` given; RFC 9580 §5.1.2: the version follows the data packet's).
 */
export async function sessionKeyPacket(
  recipient: openpgp.PublicKey,
  algorithm: openpgp.enums.symmetricNames,
  sessionKey: Uint8Array,
  aead?: Aead,
): Promise<Uint8Array> {
  const subkey = await recipient.getEncryptionKey();
  const x25519 = x25519Point(subkey.keyPacket);
  if (x25519 && AES_IDS[algorithm]) return x25519Packet(subkey.keyPacket, x25519, algorithm, sessionKey, aead ? 6 : 3);
  const ecdh = !aead && curve25519Params(subkey.keyPacket);
  if (!ecdh) {
    return openpgp.encryptSessionKey({ data: sessionKey, algorithm, ...(aead ? { aeadAlgorithm: aead } : {}), encryptionKeys: recipient, format: 'binary' });
  }

  const ephemeral = generateRawKeyPair('x25519');
  const shared = crypto.diffieHellman({ privateKey: ephemeral.privateKey, publicKey: publicKeyFromRaw('x25519', ecdh.point) });
  // The session key with its algorithm and checksum, PKCS#5-padded to a multiple of 8 octets.
  const plain = Buffer.concat([Buffer.from([openpgp.enums.symmetric[algorithm]]), sessionKey, checksum(sessionKey)]);
  const pad = 8 - (plain.length % 8);
  const cipher = crypto.createCipheriv(ecdh.wrap.name, kek(ecdh, shared), KEY_WRAP_IV);
  const wrapped = Buffer.concat([cipher.update(Buffer.concat([plain, Buffer.alloc(pad, pad)])), cipher.final()]);
  const body = Buffer.concat([
    Buffer.from([3]), // version
    Buffer.from(subkey.getKeyID().toHex(), 'hex'),
    Buffer.from([openpgp.enums.publicKey.ecdh]),
    legacyPoint(ephemeral.x), // the ephemeral point
    Buffer.from([wrapped.length]),
    wrapped,
  ]);
  return packet(1, body);
}

type KeyPacket = openpgp.PublicKeyPacket | openpgp.SecretKeyPacket | openpgp.PublicSubkeyPacket | openpgp.SecretSubkeyPacket;

/**
 * A packet to an X25519 key (RFC 9580 §5.1.6): the ephemeral public key, then the session key wrapped
 * with AES-128 under HKDF-SHA256 of ephemeral ‖ recipient ‖ shared secret, no salt, info "OpenPGP
 * X25519". Neither version adds a checksum or padding; v3 names the cipher in the clear, v6 does not.
 */
function x25519Packet(key: KeyPacket, point: Uint8Array, algorithm: openpgp.enums.symmetricNames, sessionKey: Uint8Array, version: 3 | 6): Buffer {
  const ephemeral = generateRawKeyPair('x25519');
  const shared = crypto.diffieHellman({ privateKey: ephemeral.privateKey, publicKey: publicKeyFromRaw('x25519', point) });
  const cipher = crypto.createCipheriv('id-aes128-wrap', x25519Kek(ephemeral.x, point, shared), KEY_WRAP_IV);
  const wrapped = Buffer.concat([cipher.update(sessionKey), cipher.final()]);
  const fingerprint = key.getFingerprintBytes()!;
  const recipient =
    version === 3 ? Buffer.from(key.getKeyID().toHex(), 'hex') : Buffer.concat([Buffer.from([fingerprint.length + 1, key.version]), fingerprint]); // RFC 9580 §5.1.2: key version and fingerprint
  const cleartextCipher = version === 3 ? Buffer.from([AES_IDS[algorithm]!]) : Buffer.alloc(0);
  const body = Buffer.concat([
    Buffer.from([version]),
    recipient,
    Buffer.from([openpgp.enums.publicKey.x25519]),
    ephemeral.x,
    Buffer.from([cleartextCipher.length + wrapped.length]),
    cleartextCipher,
    wrapped,
  ]);
  return packet(1, body);
}

/** RFC 9580 §5.1.6's key-wrapping key: 16 octets of HKDF-SHA256 over ephemeral ‖ recipient ‖ shared secret. */
const x25519Kek = (ephemeral: Uint8Array, recipient: Uint8Array, shared: Buffer) =>
  Buffer.from(crypto.hkdfSync('sha256', Buffer.concat([ephemeral, recipient, shared]), Buffer.alloc(0), X25519_INFO, 16));
const X25519_INFO = Buffer.from('OpenPGP X25519');

/**
 * The session key of a v3 or v6 packet to one of `privateKey`'s Curve25519 subkeys (ECDH, v3 only) or
 * X25519 subkeys (unlocked), if it opens here. Undefined for any other packet, and for one that does not
 * open: OpenPGP.js then decides (it also tries the workarounds for two old encoders' shared secrets), so
 * the errors stay its own. Nothing here depends on the data the packet protects.
 */
export async function openSessionKeyPacket(
  packet: openpgp.PublicKeyEncryptedSessionKeyPacket,
  privateKey: openpgp.PrivateKey,
): Promise<OpenedSessionKey | undefined> {
  const fields = packet as unknown as PkeskFields;
  if (fields.publicKeyID.toHex() === WILDCARD_KEY_ID) return undefined;
  try {
    const [subkey] = await privateKey.getDecryptionKeys(fields.publicKeyID); // throws when none has this key id
    if (!subkey) return undefined;
    if (fields.publicKeyAlgorithm === openpgp.enums.publicKey.x25519) return openX25519(fields, subkey.keyPacket);
    if (fields.publicKeyAlgorithm === openpgp.enums.publicKey.ecdh && fields.version === 3) return openEcdh(fields, subkey.keyPacket);
    return undefined;
  } catch {
    return undefined;
  }
}

function openEcdh(fields: PkeskFields, key: KeyPacket): OpenedSessionKey | undefined {
  const V = fields.encrypted?.V;
  const C = fields.encrypted?.C?.data;
  if (V?.length !== 33 || V[0] !== 0x40 || !C || C.length < 24 || C.length % 8) return undefined;
  const ecdh = curve25519Params(key);
  const d = (key as { privateParams?: { d?: Uint8Array } | null }).privateParams?.d;
  if (!ecdh || !d || d.length > 32) return undefined;
  // OpenPGP keeps the scalar big-endian; X25519 takes it little-endian.
  const scalar = Buffer.alloc(32);
  scalar.set(d, 32 - d.length);
  const shared = crypto.diffieHellman({ privateKey: privateKeyFromRaw('x25519', scalar.reverse()), publicKey: publicKeyFromRaw('x25519', V.subarray(1)) });
  const decipher = crypto.createDecipheriv(ecdh.wrap.name, kek(ecdh, shared), KEY_WRAP_IV);
  const padded = Buffer.concat([decipher.update(C), decipher.final()]); // throws unless the wrap's check holds
  const pad = padded[padded.length - 1];
  if (pad < 1 || pad > 8 || !padded.subarray(padded.length - pad).every((b) => b === pad)) return undefined;
  const plain = padded.subarray(0, padded.length - pad);
  const data = plain.subarray(1, plain.length - 2);
  const algorithm = AES[plain[0]];
  if (!algorithm || data.length !== algorithm.keyBytes || !crypto.timingSafeEqual(checksum(data), plain.subarray(plain.length - 2))) return undefined;
  return { data: new Uint8Array(data), algorithm: algorithm.name };
}

/** A v3 or v6 packet to an X25519 subkey; a v6 one must name the subkey's own version and fingerprint. */
function openX25519(fields: PkeskFields, key: KeyPacket): OpenedSessionKey | undefined {
  const ephemeral = fields.encrypted?.ephemeralPublicKey;
  const wrapped = fields.encrypted?.C?.wrappedKey;
  const cleartext = fields.encrypted?.C?.algorithm ?? null;
  const point = x25519Point(key);
  const k = (key as { privateParams?: { k?: Uint8Array } | null }).privateParams?.k;
  if (!point || k?.length !== 32 || ephemeral?.length !== 32 || !wrapped || wrapped.length < 24 || wrapped.length % 8) return undefined;
  if (fields.version === 6) {
    const fingerprint = key.getFingerprintBytes();
    if (cleartext !== null || fields.publicKeyVersion !== key.version || !fingerprint || !fields.publicKeyFingerprint) return undefined;
    if (!Buffer.from(fingerprint).equals(Buffer.from(fields.publicKeyFingerprint))) return undefined;
  } else if (fields.version !== 3 || cleartext === null) return undefined;
  const shared = crypto.diffieHellman({ privateKey: privateKeyFromRaw('x25519', k), publicKey: publicKeyFromRaw('x25519', ephemeral) });
  const decipher = crypto.createDecipheriv('id-aes128-wrap', x25519Kek(ephemeral, point, shared), KEY_WRAP_IV);
  const data = Buffer.concat([decipher.update(wrapped), decipher.final()]); // throws unless the wrap's check holds
  if (fields.version === 6) return AES_BY_SIZE.has(data.length) ? { data: new Uint8Array(data), algorithm: null } : undefined;
  const algorithm = AES[cleartext!];
  return algorithm && data.length === algorithm.keyBytes ? { data: new Uint8Array(data), algorithm: algorithm.name } : undefined;
}

interface PkeskFields {
  version: number;
  publicKeyID: openpgp.KeyID;
  /** v6 packets: the recipient key's version and fingerprint (null for an anonymous recipient). */
  publicKeyVersion?: number | null;
  publicKeyFingerprint?: Uint8Array | null;
  publicKeyAlgorithm: openpgp.enums.publicKey;
  /** ECDH: V, C.data; X25519: ephemeralPublicKey, C.wrappedKey and (v3) C.algorithm. */
  encrypted?: { V?: Uint8Array; ephemeralPublicKey?: Uint8Array; C?: { data?: Uint8Array; wrappedKey?: Uint8Array; algorithm?: number | null } };
}
interface EcdhOid {
  getName(): string;
  write(): Uint8Array;
}
interface EcdhKdfParams {
  hash: number;
  cipher: number;
  write(): Uint8Array;
}
interface Curve25519Params {
  /** The subkey's public point, 32 octets (without its 0x40 prefix). */
  point: Uint8Array;
  /** The KDF's parameters (RFC 9580 §11.5): curve OID, algorithm, KDF parameters, "Anonymous Sender    ", fingerprint. */
  param: Buffer;
  hash: string;
  /** The key-wrap cipher (`id-aes<bits>-wrap`) and its key size. */
  wrap: { name: string; keyBytes: number };
}

/** What the KDF and key wrap need of a v4 ECDH key on Curve25519 (legacy ids); undefined for any other key. */
function curve25519Params(key: KeyPacket): Curve25519Params | undefined {
  const { oid, Q, kdfParams } = key.publicParams as { oid?: EcdhOid; Q?: Uint8Array; kdfParams?: EcdhKdfParams };
  const fingerprint = key.getFingerprintBytes();
  const hash = kdfParams && HASHES[kdfParams.hash];
  const aes = kdfParams && AES[kdfParams.cipher];
  const ours = key.version === 4 && key.algorithm === openpgp.enums.publicKey.ecdh && oid?.getName() === 'curve25519Legacy';
  if (!ours || Q?.length !== 33 || Q[0] !== 0x40 || fingerprint?.length !== 20 || !hash || !aes) return undefined;
  const param = Buffer.concat([oid.write(), Buffer.from([openpgp.enums.publicKey.ecdh]), kdfParams.write(), Buffer.from('Anonymous Sender    '), fingerprint]);
  return { point: Q.subarray(1), param, hash, wrap: { name: `id-${aes.name}-wrap`, keyBytes: aes.keyBytes } };
}

/** The public key of an X25519 key (algorithm 25), 32 octets; undefined for any other key. */
function x25519Point(key: KeyPacket): Uint8Array | undefined {
  const { A } = key.publicParams as { A?: Uint8Array };
  return key.algorithm === openpgp.enums.publicKey.x25519 && A?.length === 32 ? A : undefined;
}

/** The key-wrapping key: the hash of 00000001 ‖ shared secret ‖ parameters, cut to the wrap's key size. */
const kek = (ecdh: Curve25519Params, shared: Buffer) =>
  crypto
    .createHash(ecdh.hash)
    .update(Buffer.from([0, 0, 0, 1]))
    .update(shared)
    .update(ecdh.param)
    .digest()
    .subarray(0, ecdh.wrap.keyBytes);

/** The two-octet sum of a session key's octets. */
const checksum = (key: Uint8Array) => {
  const sum = key.reduce((s, b) => (s + b) & 0xffff, 0);
  return Buffer.from([sum >> 8, sum & 0xff]);
};

/** The KDF hashes RFC 9580 §11.5 allows, by their OpenPGP ids. */
const HASHES: Record<number, string> = { 8: 'sha256', 9: 'sha384', 10: 'sha512' };
/** AES by OpenPGP id: the key-wrap ciphers RFC 9580 §11.5 allows, and the session key ciphers opened here (the native decryption is AES only). */
const AES: Record<number, { name: openpgp.enums.symmetricNames; keyBytes: number }> = {
  7: { name: 'aes128', keyBytes: 16 },
  8: { name: 'aes192', keyBytes: 24 },
  9: { name: 'aes256', keyBytes: 32 },
};
const AES_IDS: Partial<Record<openpgp.enums.symmetricNames, number>> = { aes128: 7, aes192: 8, aes256: 9 };
const AES_BY_SIZE = new Set([16, 24, 32]);
const KEY_WRAP_IV = Buffer.from('a6a6a6a6a6a6a6a6', 'hex'); // RFC 3394's default IV
