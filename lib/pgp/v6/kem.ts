import * as crypto from 'node:crypto';
import { generateRawKeyPair, publicKeyFromRaw } from '../../curve25519';
import { invalid } from '../../errors';
import { packet } from '../packets';
import { MLKEM768_X25519, privateParts, publicParts } from './key-material';
import { KEY_FLAGS, TAG } from './packets-v6';
import type { UnlockedV6Key, V6Key, V6KeyPart, V6Secret } from './read-key';
import { Cursor } from './wire';

/**
 * Public-key encrypted session key packets, version 6 (RFC 9580 §5.1.2), to ML-KEM-768+X25519 subkeys
 * (RFC 9980), on Node's ML-KEM, X25519 and AES key wrap. The fields after the algorithm: the X25519
 * ephemeral public key (32 octets), the ML-KEM ciphertext (1088), one octet of length, then the session
 * key wrapped (RFC 3394) under the key combiner's output:
 *
 *   KEK = SHA3-256(mlkemShare ‖ ecdhShare ‖ ecdhCiphertext ‖ ecdhPublicKey ‖ 35 ‖ "OpenPGPCompositeKDFv1" ‖ 21)
 *
 * A v6 packet carries neither a cipher octet nor a checksum: the SEIPDv2 packet names its cipher, and
 * the key wrap's integrity check is the only check.
 */

const DOMAIN = Buffer.from('OpenPGPCompositeKDFv1');
const X25519_BYTES = 32;
const MLKEM768_CIPHERTEXT_BYTES = 1088;
const KEY_WRAP_IV = Buffer.from('a6a6a6a6a6a6a6a6', 'hex'); // RFC 3394's default IV

/**
 * The framed packet giving `sessionKey` (16, 24 or 32 octets: an AES key) to `recipient`'s newest
 * ML-KEM-768+X25519 subkey that may encrypt and is in force at `now`.
 */
export function pqcSessionKeyPacket(recipient: V6Key, sessionKey: Uint8Array, now = new Date()): Buffer {
  if (![16, 24, 32].includes(sessionKey.length)) throw new Error(`a session key of ${sessionKey.length} octets (AES keys are 16, 24 or 32)`);
  const subkey = encryptionSubkey(recipient, now);
  const parts = publicParts(MLKEM768_X25519, subkey.publicMaterial);
  const ephemeral = generateRawKeyPair('x25519');
  const ecdhShare = crypto.diffieHellman({ privateKey: ephemeral.privateKey, publicKey: parts.ecc });
  const { sharedKey: mlkemShare, ciphertext } = crypto.encapsulate(parts.pq!);
  const cipher = crypto.createCipheriv('id-aes256-wrap', combine(mlkemShare, ecdhShare, ephemeral.x, parts.eccRaw), KEY_WRAP_IV);
  const wrapped = Buffer.concat([cipher.update(sessionKey), cipher.final()]);
  const fingerprint = Buffer.from(subkey.fingerprint, 'hex');
  return packet(
    TAG.pkesk,
    Buffer.concat([
      Buffer.from([6, 1 + fingerprint.length, 6]),
      fingerprint,
      Buffer.from([MLKEM768_X25519]),
      ephemeral.x,
      ciphertext,
      Buffer.from([wrapped.length]),
      wrapped,
    ]),
  );
}

/**
 * The session key of a v6 packet body to one of `unlockedKey`'s ML-KEM-768+X25519 subkeys (named by its
 * fingerprint, or an anonymous recipient, which each such subkey tries). Undefined for any other packet
 * and for one that does not open, the same way whatever the reason: no error tells a sender which step
 * failed (ML-KEM's decapsulation rejects implicitly, and the key wrap's check is the one check).
 */
export function openPqcSessionKeyPacket(packetBody: Uint8Array, unlockedKey: UnlockedV6Key): Buffer | undefined {
  const fields = read(Buffer.from(packetBody.buffer, packetBody.byteOffset, packetBody.byteLength));
  if (!fields) return undefined;
  for (const secret of unlockedKey.secrets) {
    if (secret.algorithm !== MLKEM768_X25519 || (fields.recipient && !fields.recipient.equals(secret.fingerprint.subarray(0, fields.recipient.length))))
      continue;
    const opened = open(fields, secret);
    if (opened) return opened;
  }
  return undefined;
}

/**
 * Whom a post-quantum session key packet names, and with what: the key id (hex; its fingerprint's first 8
 * octets in a v6 packet, 16 zeros for an anonymous one) and the cipher a v3 packet names in the clear (the
 * SEIPDv1 data's; null in a v6 packet, whose SEIPDv2 names its own). Undefined for any other packet.
 */
export function pqcPacketRecipient(packetBody: Uint8Array): { keyId: string; cipher: number | null } | undefined {
  const fields = read(Buffer.from(packetBody.buffer, packetBody.byteOffset, packetBody.byteLength));
  return fields && { keyId: fields.recipient?.subarray(0, 8).toString('hex') ?? '0000000000000000', cipher: fields.cipher };
}

interface Fields {
  /** The recipient: a v6 packet's fingerprint (32 octets) or a v3 packet's key id (8); undefined when anonymous. */
  recipient: Buffer | undefined;
  /** A v3 packet's cleartext cipher id; null in a v6 packet. */
  cipher: number | null;
  ecdhCiphertext: Buffer;
  mlkemCiphertext: Buffer;
  wrapped: Buffer;
}

/**
 * The fields of a PKESK to algorithm 35, each of its exact size, or undefined for anything else: version 6
 * (with SEIPDv2), or version 3 (with SEIPDv1, as senders write to a key whose features list no SEIPDv2),
 * whose last fields are the cipher id in the clear and then the wrapped key, as for X25519 (RFC 9580 §5.1.6).
 */
function read(body: Buffer): Fields | undefined {
  try {
    const c = new Cursor(body, () => new Error('malformed'));
    const version = c.u8();
    let recipient: Buffer | undefined;
    if (version === 6) {
      const recipientBytes = c.u8();
      if (recipientBytes !== 0 && recipientBytes !== 33) return undefined; // anonymous, or a v6 key's version and fingerprint
      if (recipientBytes && c.u8() !== 6) return undefined;
      recipient = recipientBytes ? c.bytes(32) : undefined;
    } else if (version === 3) {
      const keyId = c.bytes(8);
      recipient = keyId.every((b) => b === 0) ? undefined : keyId;
    } else return undefined;
    if (c.u8() !== MLKEM768_X25519) return undefined;
    const ecdhCiphertext = c.bytes(X25519_BYTES);
    const mlkemCiphertext = c.bytes(MLKEM768_CIPHERTEXT_BYTES);
    const rest = c.bytes(c.u8());
    const cipher = version === 3 ? rest[0] : null;
    const wrapped = version === 3 ? rest.subarray(1) : rest;
    if (c.left || wrapped.length < 24 || wrapped.length > 40 || wrapped.length % 8) return undefined;
    return { recipient, cipher, ecdhCiphertext, mlkemCiphertext, wrapped };
  } catch {
    return undefined;
  }
}

function open(fields: Fields, secret: V6Secret): Buffer | undefined {
  try {
    const parts = privateParts(MLKEM768_X25519, secret.secretMaterial);
    const mlkemShare = crypto.decapsulate(parts.pq!, fields.mlkemCiphertext);
    const ecdhShare = crypto.diffieHellman({ privateKey: parts.ecc, publicKey: publicKeyFromRaw('x25519', fields.ecdhCiphertext) });
    const kek = combine(mlkemShare, ecdhShare, fields.ecdhCiphertext, secret.publicMaterial.subarray(0, X25519_BYTES));
    const decipher = crypto.createDecipheriv('id-aes256-wrap', kek, KEY_WRAP_IV);
    return Buffer.concat([decipher.update(fields.wrapped), decipher.final()]); // throws unless the wrap's check holds
  } catch {
    return undefined;
  }
}

/** RFC 9980's key combiner for ML-KEM-768+X25519. */
const combine = (mlkemShare: Buffer, ecdhShare: Buffer, ecdhCiphertext: Buffer, ecdhPublicKey: Buffer): Buffer =>
  crypto
    .createHash('sha3-256')
    .update(mlkemShare)
    .update(ecdhShare)
    .update(ecdhCiphertext)
    .update(ecdhPublicKey)
    .update(Buffer.from([MLKEM768_X25519]))
    .update(DOMAIN)
    .update(Buffer.from([DOMAIN.length]))
    .digest();

/**
 * The ML-KEM-768+X25519 subkeys that may encrypt at `now` (flags, not revoked, not expired, created), newest
 * first; none when the primary key itself is revoked or expired.
 */
export function pqcEncryptionSubkeys(key: V6Key, now: Date): V6KeyPart[] {
  if (!inForce(key.primary, now)) return [];
  return key.subkeys
    .filter((s) => s.algorithm === MLKEM768_X25519 && s.flags & KEY_FLAGS.encrypt && inForce(s, now))
    .sort((a, b) => b.created.getTime() - a.created.getTime());
}

/** The newest ML-KEM-768+X25519 subkey that may encrypt, of a key neither revoked nor expired at `now`. */
function encryptionSubkey(key: V6Key, now: Date): V6KeyPart {
  const [subkey] = pqcEncryptionSubkeys(key, now);
  if (subkey) return subkey;
  throw invalid(
    'no_encryption_key',
    `Cannot encrypt to this key: ${inForce(key.primary, now) ? 'it has no ML-KEM-768+X25519 subkey in force' : 'it is revoked or expired'}.`,
  );
}

const inForce = (k: V6KeyPart, now: Date) => !k.revoked && k.created <= now && (k.expiresAt === null || now < k.expiresAt);
