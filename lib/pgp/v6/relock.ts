import { packet } from '../packets';
import { MLDSA65_ED25519, publicMaterialBytes, secretMatches } from './key-material';
import { lockMaterial, unlockMaterial } from './lock';
import { readKeyPacket, TAG } from './packets-v6';
import { badKey, packetList, type RawPacket } from './wire';

/**
 * A v6 transferable key brought in from elsewhere, as the service keeps it: its public key's packets,
 * and for a secret key the same packets with every secret unlocked by the passphrase it came with and
 * locked again with the service's secret (lock.ts). The signatures are kept as they are; read-key.ts
 * has verified them (call it first: this checks no signature).
 */

/** As read-key.ts bounds a key. */
const LIMITS = { maxPackets: 32, maxPacketBytes: 16 * 1024 };
/** Locked secret parts unlocked for one import (a primary key and a few subkeys), as for v4 keys. */
const MAX_LOCKED_PARTS = 4;
const TO_PUBLIC: Record<number, number> = { [TAG.secretKey]: TAG.publicKey, [TAG.secretSubkey]: TAG.publicSubkey };
const USAGE_UNPROTECTED = 0;

/** Whether binary key packets begin with a v6 ML-DSA-65+Ed25519 primary key (RFC 9980), which OpenPGP.js cannot read. */
export function startsWithPqcPrimary(bytes: Uint8Array): boolean {
  const ctb = bytes[0] ?? 0;
  let tag: number;
  let start: number;
  if (!(ctb & 0x80)) return false;
  if (ctb & 0x40) {
    tag = ctb & 0x3f;
    const o = bytes[1] ?? 0;
    start = o < 192 ? 2 : o < 224 ? 3 : o === 255 ? 6 : -1;
  } else {
    tag = (ctb >> 2) & 0x0f;
    start = (ctb & 3) === 3 ? -1 : 1 + (1 << (ctb & 3));
  }
  // The body: version (1 octet), creation time (4), algorithm (1).
  return (tag === TAG.publicKey || tag === TAG.secretKey) && start > 0 && bytes[start] === 6 && bytes[start + 5] === MLDSA65_ED25519;
}

/** The key's packets without trust packets (local data, never signed), secret key packets as public ones. */
export function publicV6Packets(bytes: Uint8Array): Buffer {
  return Buffer.concat(
    packets(bytes).map((p) => {
      const tag = TO_PUBLIC[p.tag];
      return tag ? packet(tag, readKeyPacket(p.body, true, badKey, publicMaterialBytes).publicBody) : packet(p.tag, p.body);
    }),
  );
}

export interface RelockErrors {
  /** A locked part and no passphrase. */
  passphraseRequired: () => Error;
  wrongPassphrase: () => Error;
  /** A secret that is not that of its public key. */
  mismatch: () => Error;
  /** A lock not read here (lock.ts). */
  unsupported: (why: string) => Error;
  /** A lock whose key derivation costs more than the service spends (Argon2 past lock.ts MAX_ARGON2, too many locked parts). */
  tooCostly: (why: string) => Error;
}

/** The secret key's packets, each secret unlocked with `passphrase` (when locked) and locked with `secret` at `s2kCountByte`. */
export function relockV6Key(bytes: Uint8Array, passphrase: string | undefined, secret: string, s2kCountByte: number, errors: RelockErrors): Buffer {
  const list = packets(bytes);
  const fields = (p: RawPacket) => readKeyPacket(p.body, true, badKey, publicMaterialBytes);
  const locked = list.filter((p) => TO_PUBLIC[p.tag] && fields(p).secretPart[0] !== USAGE_UNPROTECTED).length;
  if (locked > MAX_LOCKED_PARTS) throw errors.tooCostly(`The key has ${locked} locked secret parts; at most ${MAX_LOCKED_PARTS} are accepted`);
  if (locked && !passphrase) throw errors.passphraseRequired();
  const relocked = list.map((p) => {
    if (!TO_PUBLIC[p.tag]) return packet(p.tag, p.body);
    const k = fields(p);
    const material = unlockMaterial(p.tag, k.publicBody, k.secretPart, passphrase ?? '', errors.unsupported, errors.tooCostly);
    if (!material) throw errors.wrongPassphrase();
    if (!secretMatches(k.algorithm, k.publicMaterial, material)) throw errors.mismatch();
    return packet(p.tag, Buffer.concat([k.publicBody, lockMaterial(p.tag, k.publicBody, material, secret, s2kCountByte)]));
  });
  return Buffer.concat(relocked);
}

function packets(bytes: Uint8Array): RawPacket[] {
  return packetList(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength), LIMITS, badKey).filter((p) => p.tag !== TAG.trust);
}
