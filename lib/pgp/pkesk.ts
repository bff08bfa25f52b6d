import * as crypto from 'node:crypto';
import * as openpgp from 'openpgp';
import { generateRawKeyPair, privateKeyFromRaw, publicKeyFromRaw } from '../curve25519';
import { legacyPoint, packet } from './packets';

/**
 * Public-key encrypted session key packets (v3, RFC 9580 §5.1) for ECDH on Curve25519 (the keys we make,
 * and gpg's default), made and opened on Node's X25519, the RFC 9580 §11.5 KDF and AES key wrap.
 * OpenPGP.js does the same through WebCrypto, a thread-pool round trip per step, at about three times the
 * CPU a message (docs/performance.md). OpenPGP.js still picks and checks the keys, and handles every
 * other kind of key and packet.
 */

/** The key id a session key packet gives for a hidden recipient ("wildcard", RFC 9580 §5.1). */
export const WILDCARD_KEY_ID = '0000000000000000';

/** The packet of a message to `recipient`, framed. */
export async function sessionKeyPacket(recipient: openpgp.PublicKey, algorithm: openpgp.enums.symmetricNames, sessionKey: Uint8Array): Promise<Uint8Array> {
  const subkey = await recipient.getEncryptionKey();
  const ecdh = curve25519Params(subkey.keyPacket);
  if (!ecdh) return openpgp.encryptSessionKey({ data: sessionKey, algorithm, encryptionKeys: recipient, format: 'binary' });

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

/**
 * The session key of a v3 packet to one of `privateKey`'s Curve25519 subkeys (unlocked), if it opens
 * here. Undefined for any other packet, and for one that does not open: OpenPGP.js then decides (it
 * also tries the workarounds for two old encoders' shared secrets), so the errors stay its own.
 */
export async function openSessionKeyPacket(
  packet: openpgp.PublicKeyEncryptedSessionKeyPacket,
  privateKey: openpgp.PrivateKey,
): Promise<openpgp.SessionKey | undefined> {
  const { version, publicKeyID, publicKeyAlgorithm, encrypted } = packet as unknown as PkeskFields;
  const V = encrypted?.V;
  const C = encrypted?.C?.data;
  if (version !== 3 || publicKeyAlgorithm !== openpgp.enums.publicKey.ecdh || publicKeyID.toHex() === WILDCARD_KEY_ID) return undefined;
  if (V?.length !== 33 || V[0] !== 0x40 || !C || C.length < 24 || C.length % 8) return undefined;
  try {
    const [subkey] = await privateKey.getDecryptionKeys(publicKeyID); // throws when none has this key id
    const ecdh = subkey && curve25519Params(subkey.keyPacket);
    const d = (subkey?.keyPacket as { privateParams?: { d?: Uint8Array } | null } | undefined)?.privateParams?.d;
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
  } catch {
    return undefined;
  }
}

interface PkeskFields {
  version: number;
  publicKeyID: openpgp.KeyID;
  publicKeyAlgorithm: openpgp.enums.publicKey;
  encrypted?: { V?: Uint8Array; C?: { data?: Uint8Array } };
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
function curve25519Params(
  key: openpgp.PublicKeyPacket | openpgp.SecretKeyPacket | openpgp.PublicSubkeyPacket | openpgp.SecretSubkeyPacket,
): Curve25519Params | undefined {
  const { oid, Q, kdfParams } = key.publicParams as { oid?: EcdhOid; Q?: Uint8Array; kdfParams?: EcdhKdfParams };
  const fingerprint = key.getFingerprintBytes();
  const hash = kdfParams && HASHES[kdfParams.hash];
  const aes = kdfParams && AES[kdfParams.cipher];
  const ours = key.version === 4 && key.algorithm === openpgp.enums.publicKey.ecdh && oid?.getName() === 'curve25519Legacy';
  if (!ours || Q?.length !== 33 || Q[0] !== 0x40 || fingerprint?.length !== 20 || !hash || !aes) return undefined;
  const param = Buffer.concat([oid.write(), Buffer.from([openpgp.enums.publicKey.ecdh]), kdfParams.write(), Buffer.from('Anonymous Sender    '), fingerprint]);
  return { point: Q.subarray(1), param, hash, wrap: { name: `id-${aes.name}-wrap`, keyBytes: aes.keyBytes } };
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
const KEY_WRAP_IV = Buffer.from('a6a6a6a6a6a6a6a6', 'hex'); // RFC 3394's default IV
