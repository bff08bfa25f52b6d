import { invalid } from '../../errors';
import { isSigningAlgorithm, publicMaterialBytes, publicParts, secretMatches, type PublicParts, type SigningAlgorithm, type V6Algorithm } from './key-material';
import { unlockMaterial } from './lock';
import {
  KEY_FLAGS,
  fingerprintOf,
  keyHashed,
  readKeyPacket,
  readSignature,
  SIG,
  SUB,
  TAG,
  userIdHashed,
  verifyParts,
  type KeyPacketFields,
  type V6Signature,
} from './packets-v6';
import { badKey, packetList } from './wire';

/**
 * Transferable v6 public and secret keys (RFC 9580 §10.1) of the algorithms made here (Ed25519, X25519,
 * ML-DSA-65+Ed25519, ML-KEM-768+X25519), read without OpenPGP.js, which has no post-quantum algorithms.
 * Every self-signature is verified; one that does not verify is passed over, as RFC 9580 §5.2.4 has it,
 * and a key whose primary key, or a subkey whose binding, keeps no valid one is refused. Third-party
 * certifications (another issuer) are passed over unverified. Strict bounds: only v6 packets, exact
 * material sizes, at most MAX_PACKETS packets of at most MAX_PACKET_BYTES each.
 */

const MAX_PACKETS = 32;
/** A post-quantum signature packet is about 3.4 KiB and its public key 2 KiB; four times that is plenty. */
const MAX_PACKET_BYTES = 16 * 1024;
const MAX_KEY_BYTES = 128 * 1024;
const CERTIFICATIONS = new Set<number>([0x10, 0x11, 0x12, 0x13]);

export interface V6KeyPart {
  algorithm: V6Algorithm;
  created: Date;
  /** 64 lowercase hex digits. */
  fingerprint: string;
  /** The fingerprint's first 16 hex digits. */
  keyId: string;
  publicMaterial: Buffer;
  /** The first octet of the key flags (RFC 9580 §5.2.3.29) of its newest valid self-signature; 0 when it has none. */
  flags: number;
  expiresAt: Date | null;
  /** A valid revocation signature (key or subkey revocation) is present. */
  revoked: boolean;
}

export interface V6Key {
  secret: boolean;
  fingerprint: string;
  keyId: string;
  primary: V6KeyPart;
  subkeys: V6KeyPart[];
  /** User ids with a valid self-certification; the primary one first. */
  userIds: Array<{ userId: string; primary: boolean; revoked: boolean }>;
  /** The features octet (RFC 9580 §5.2.3.32): 0x01 SEIPDv1, 0x08 SEIPDv2. */
  features: number;
  preferences: { symmetric: number[]; aead: Array<[number, number]>; hash: number[]; compression: number[] };
}

/** A (sub)key's secret material, unlocked, with what identifies it. */
export interface V6Secret {
  algorithm: V6Algorithm;
  fingerprint: Buffer;
  publicMaterial: Buffer;
  secretMaterial: Buffer;
}

export interface UnlockedV6Key {
  key: V6Key;
  /** The primary key's secret first, then each subkey's, in the key's order. */
  secrets: V6Secret[];
}

export function readV6Key(bytes: Uint8Array, now = new Date()): V6Key {
  return parse(bytes, now).key;
}

/** The secrets of a transferable secret key locked with `secret`, each checked against its public key. */
export function unlockV6Key(privatePackets: Uint8Array, secret: string, now = new Date()): UnlockedV6Key {
  const { key, packets } = parse(privatePackets, now);
  if (!key.secret) throw badKey('a public key, not a secret key');
  const secrets = packets.map((p, i): V6Secret => {
    const tag = i === 0 ? TAG.secretKey : TAG.secretSubkey;
    const material = unlockMaterial(tag, p.publicBody, p.secretPart, secret, badKey);
    if (!material) throw invalid('wrong_passphrase', 'The key secret is wrong.');
    if (!secretMatches(p.algorithm, p.publicMaterial, material))
      throw badKey(`the secret key material of ${fingerprintOf(p.publicBody).toString('hex')} is not that of its public key`);
    return { algorithm: p.algorithm, fingerprint: fingerprintOf(p.publicBody), publicMaterial: p.publicMaterial, secretMaterial: material };
  });
  return { key, secrets };
}

interface Section {
  signatures: V6Signature[];
}

function parse(bytes: Uint8Array, now: Date): { key: V6Key; packets: KeyPacketFields[] } {
  if (bytes.length > MAX_KEY_BYTES) throw badKey(`${bytes.length} octets (at most ${MAX_KEY_BYTES} here)`);
  const list = packetList(
    Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength),
    { maxPackets: MAX_PACKETS, maxPacketBytes: MAX_PACKET_BYTES },
    badKey,
  ).filter(
    (p) => p.tag !== TAG.trust, // local trust data, never signed (RFC 9580 §5.10)
  );
  const first = list[0];
  if (!first || (first.tag !== TAG.publicKey && first.tag !== TAG.secretKey)) throw badKey('it does not start with a primary key packet');
  const secret = first.tag === TAG.secretKey;
  const primaryPacket = readKeyPacket(first.body, secret, badKey, publicMaterialBytes);
  if (!isSigningAlgorithm(primaryPacket.algorithm)) throw badKey(`a primary key of algorithm ${primaryPacket.algorithm}, which cannot certify`);

  const primarySection: Section = { signatures: [] };
  const userIds: Array<Section & { userId: Buffer }> = [];
  const subkeys: Array<Section & { packet: KeyPacketFields }> = [];
  let current: Section = primarySection;
  for (const p of list.slice(1)) {
    if (p.tag === TAG.signature) current.signatures.push(readSignature(p.body, badKey));
    else if (p.tag === TAG.userId) {
      const u = { signatures: [], userId: p.body };
      userIds.push(u);
      current = u;
    } else if (p.tag === (secret ? TAG.secretSubkey : TAG.publicSubkey)) {
      const k = { signatures: [], packet: readKeyPacket(p.body, secret, badKey, publicMaterialBytes) };
      subkeys.push(k);
      current = k;
    } else if (p.tag === TAG.publicKey || p.tag === TAG.secretKey) throw badKey('a second primary key (one key at a time is read here)');
    else throw badKey(`a packet of type ${p.tag} ${p.tag === TAG.publicSubkey || p.tag === TAG.secretSubkey ? 'mixing public and secret keys' : 'in a key'}`);
  }

  const fingerprint = fingerprintOf(primaryPacket.publicBody);
  const signer = importPublic(primaryPacket);
  const nowSeconds = Math.floor(now.getTime() / 1000);
  const primaryHashed = keyHashed(primaryPacket.publicBody);
  /** Self-signatures of these types over `signed` that verify by `key`, newest first. */
  const valid = (sigs: V6Signature[], types: ReadonlySet<number>, signed: Buffer[], key: PublicParts = signer, keyCreated = primaryPacket.created) =>
    sigs
      .filter((s) => types.has(s.type) && (!s.issuerFingerprint || s.issuerFingerprint.equals(fingerprint)) && inForce(s, keyCreated, nowSeconds))
      .filter((s) => verifyParts(s, signed, key))
      .sort((a, b) => (b.created ?? 0) - (a.created ?? 0));

  const direct = valid(primarySection.signatures, new Set([SIG.directKey]), [primaryHashed])[0];
  const keyRevoked = valid(primarySection.signatures, new Set([SIG.keyRevocation]), [primaryHashed]).length > 0;
  const boundUserIds = userIds
    .map((u) => {
      const signed = [primaryHashed, userIdHashed(u.userId)];
      const certification = valid(u.signatures, CERTIFICATIONS, signed)[0];
      const revoked = valid(u.signatures, new Set([SIG.certificationRevocation]), signed).length > 0;
      return { userId: utf8(u.userId), certification, revoked };
    })
    .filter((u): u is { userId: string; certification: V6Signature; revoked: boolean } => !!u.certification);
  const primaryUser =
    boundUserIds.find((u) => !u.revoked && flag(u.certification, SUB.primaryUserId)) ?? boundUserIds.find((u) => !u.revoked) ?? boundUserIds[0];
  // A v6 key's own properties are those of its direct-key signature, else of its primary user id's (RFC 9580 §5.2.3.10).
  const properties = direct ?? primaryUser?.certification;
  if (!properties) throw badKey('no valid self-signature on the primary key (direct-key signature or user id certification)');

  const subkeyParts = subkeys.map((s): V6KeyPart => {
    const fp = fingerprintOf(s.packet.publicBody);
    importPublic(s.packet); // refused now rather than when first encrypted to
    const signed = [primaryHashed, keyHashed(s.packet.publicBody)];
    const binding = valid(s.signatures, new Set([SIG.subkeyBinding]), signed, signer, s.packet.created).find((b) =>
      backSigned(b, s.packet, signed, nowSeconds),
    );
    if (!binding) throw badKey(`subkey ${fp.toString('hex')} has no valid binding signature`);
    const revoked = valid(s.signatures, new Set([SIG.subkeyRevocation]), signed).length > 0;
    return part(s.packet, fp, binding, revoked);
  });

  const ordered = [...boundUserIds].sort((a, b) => Number(b === primaryUser) - Number(a === primaryUser));
  const key: V6Key = {
    secret,
    fingerprint: fingerprint.toString('hex'),
    keyId: fingerprint.subarray(0, 8).toString('hex'),
    primary: part(primaryPacket, fingerprint, properties, keyRevoked),
    subkeys: subkeyParts,
    userIds: ordered.map((u) => ({ userId: u.userId, primary: u === primaryUser, revoked: u.revoked })),
    features: sub(properties, SUB.features)?.[0] ?? 0,
    preferences: {
      symmetric: [...(sub(properties, SUB.prefSymmetric) ?? [])],
      aead: pairs(sub(properties, SUB.prefAead)),
      hash: [...(sub(properties, SUB.prefHash) ?? [])],
      compression: [...(sub(properties, SUB.prefCompression) ?? [])],
    },
  };
  return { key, packets: [primaryPacket, ...subkeys.map((s) => s.packet)] };
}

/** A signature made at or after its key and not after now, and not expired (RFC 9580 §5.2.3.18). */
function inForce(sig: V6Signature, keyCreated: number, now: number): boolean {
  if (sig.created === undefined || sig.created < keyCreated || sig.created > now) return false;
  const expires = sub(sig, SUB.sigExpires);
  const seconds = expires?.length === 4 ? expires.readUInt32BE(0) : 0;
  return !seconds || sig.created + seconds > now;
}

/**
 * A binding that lets a subkey sign must carry the subkey's own primary key binding signature (0x19,
 * RFC 9580 §5.2.1.9) as an embedded signature; a subkey that only encrypts needs none.
 */
function backSigned(binding: V6Signature, subkey: KeyPacketFields, signed: Buffer[], now: number): boolean {
  if (!((sub(binding, SUB.keyFlags)?.[0] ?? 0) & KEY_FLAGS.sign)) return true;
  if (!isSigningAlgorithm(subkey.algorithm)) return false;
  const algorithm: SigningAlgorithm = subkey.algorithm;
  const key = importPublic(subkey);
  return [...binding.hashed, ...binding.unhashed]
    .filter((s) => s.type === SUB.embeddedSignature)
    .some((s) => {
      try {
        const back = readSignature(s.data, badKey);
        return back.type === SIG.primaryKeyBinding && back.algorithm === algorithm && inForce(back, subkey.created, now) && verifyParts(back, signed, key);
      } catch {
        return false;
      }
    });
}

/** Node's keys of a key packet's material; material Node refuses (ML-KEM's modulus check, FIPS 203 §7.2) makes the key unreadable. */
function importPublic(packet: KeyPacketFields): PublicParts {
  try {
    return publicParts(packet.algorithm, packet.publicMaterial);
  } catch {
    throw badKey(`algorithm ${packet.algorithm} public key material that is not a valid key`);
  }
}

function part(packet: KeyPacketFields, fingerprint: Buffer, sig: V6Signature, revoked: boolean): V6KeyPart {
  const expires = sub(sig, SUB.keyExpires);
  const seconds = expires?.length === 4 ? expires.readUInt32BE(0) : 0;
  return {
    algorithm: packet.algorithm,
    created: new Date(packet.created * 1000),
    fingerprint: fingerprint.toString('hex'),
    keyId: fingerprint.subarray(0, 8).toString('hex'),
    publicMaterial: packet.publicMaterial,
    flags: sub(sig, SUB.keyFlags)?.[0] ?? 0,
    expiresAt: seconds ? new Date((packet.created + seconds) * 1000) : null,
    revoked,
  };
}

/** A hashed subpacket's data (only the hashed area says anything about the key). */
const sub = (sig: V6Signature, type: number): Buffer | undefined => sig.hashed.find((s) => s.type === type)?.data;
const flag = (sig: V6Signature, type: number): boolean => !!sub(sig, type)?.[0];
const pairs = (data: Buffer | undefined): Array<[number, number]> =>
  Array.from({ length: Math.floor((data?.length ?? 0) / 2) }, (_, i) => [data![2 * i], data![2 * i + 1]]);

function utf8(bytes: Buffer): string {
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw badKey('a user id that is not UTF-8');
  }
}
