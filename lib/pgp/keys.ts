import type * as openpgp from 'openpgp';
import { invalid } from '../errors';
import { LruCache } from '../lru';
import { armorKey, dearmorKey } from './armor';
import { curve25519Key } from './keygen';
import { v6Key } from './v6/keygen';
import { readV6Key, unlockV6Key, type UnlockedV6Key, type V6Key } from './v6/read-key';
import { startsWithPqcPrimary } from './v6/relock';
import { type KeyAlgorithm, type KeyProfile, KEY_PROFILES, defaultAlgorithm, profileAllows } from './profiles';

/**
 * OpenPGP keys we generate and keys users hand us. The `rfc4880` profile (profiles.ts) is chosen so that
 * GnuPG 2.2 and Sequoia 0.27 read our keys and what we encrypt to them (NOTES.md, "OpenPGP peers"): v4
 * keys, legacy Curve25519 ids, and no SEIPDv2 feature flag (the recipient key's flags decide whether a
 * message to it is SEIPDv1 or SEIPDv2). The `rfc9580` and `pqc` profiles make v6 keys (v6/keygen.ts).
 */
export type { KeyAlgorithm, KeyProfile } from './profiles';

/** Supplied public keys above this size are refused (413) before parsing; real certificates are a few KiB. */
export const MAX_PUBLIC_KEY_BYTES = 1 << 20;

/**
 * OpenPGP.js, loaded on first use: an API process parses keys only for some requests (a supplied public
 * key, a passphrase check), and its ~22,000 heap objects would otherwise be walked by every mark-compact
 * of every process. Workers load it with their first crypto job (jobs import lib/pgp/stream when they run).
 */
let openpgpModule: Promise<typeof openpgp> | undefined;
// The promise is kept: each import() of a loaded module goes through the loader's resolution again.
export const loadOpenpgp = () => (openpgpModule ??= import('openpgp'));

/**
 * Key generation preferences end up in the self-signatures: AES-256 first, SHA-512/256, compression
 * "uncompressed" first (peers that honour prefs will not compress on our behalf), MDC only (no SEIPDv2).
 * OpenPGP.js makes RSA keys with them; keygen.ts writes the same into Curve25519 keys (its test compares).
 */
export const keygenConfig = ({ enums }: typeof openpgp): openpgp.PartialConfig => ({
  v6Keys: false,
  aeadProtect: false,
  preferredSymmetricAlgorithm: enums.symmetric.aes256,
  preferredHashAlgorithm: enums.hash.sha512,
  preferredCompressionAlgorithm: enums.compression.uncompressed,
});

/**
 * How generated private keys are locked. The secret is 256 random bits (lineage.ts `randomSecret`), so
 * key stretching buys nothing: OpenPGP.js's default iterated S2K (count byte 224: 16 MiB hashed, the
 * buffer allocated whole, once per key packet, on every lock and unlock) was most of a rotation's time
 * and the rotation worker's memory peak. Count byte 0 is the smallest the format allows: the AES-256 key
 * is SHA-256 over 1 KiB of salt ‖ secret repeated, a direct derivation from a secret no one can guess.
 *
 * Why still OpenPGP's own lock rather than AES-256-GCM over the unencrypted packets: the stored block
 * stays a standard passphrase-protected private key (gpg imports it with the secret; GeneratedKey's
 * contract and every stored row keep one format), and rows locked at the old count open through the same
 * code, since the count travels in each packet. Integrity does not rest on OpenPGP's SHA-1 checksum: the
 * stored block is sealed under the master key with AAD bound to its row (lib/sealer.ts), and
 * unlockPrivateKey checks every (sub)key's secret against its public parameters (no key overwriting).
 * Only for secrets from randomSecret(): a human passphrase must never be locked this way.
 */
export const GENERATION_S2K_COUNT_BYTE = 0;

export interface GenerateKeyInput {
  name: string;
  email: string;
  /** Default: `rfc4880`. */
  profile?: KeyProfile;
  /** Default: the profile's first (profiles.ts PROFILE_ALGORITHMS); it must be one of the profile's. */
  algorithm?: KeyAlgorithm;
  /** Protects the private key: a random secret from lineage.ts `randomSecret` (no key stretching, see above). */
  secret: string;
  expiresInDays?: number;
  /** Creation time (tests, reproducible fixtures); defaults to now. */
  date?: Date;
}

export interface GeneratedKey {
  /** Lowercase hex: 40 digits for a v4 key (SHA-1), 64 for a v6 key (SHA-256). */
  fingerprint: string;
  /** 16 lowercase hex digits: the primary key id (the last 8 octets of a v4 fingerprint, the first 8 of a v6 one). */
  keyId: string;
  /** Key ids of the encryption-capable subkeys: what PKESK packets of messages to this key name. */
  encryptionKeyIds: string[];
  publicArmored: string;
  privateArmored: string;
  profile: KeyProfile;
  algorithm: KeyAlgorithm;
  createdAt: Date;
  expiresAt: Date | null;
}

/** RSA sizes; Curve25519 keys are made in keygen.ts. */
const RSA_BITS: Record<string, number> = { rsa3072: 3072, rsa4096: 4096 };

export async function generateKey(input: GenerateKeyInput): Promise<GeneratedKey> {
  const profile = input.profile ?? 'rfc4880';
  if (!KEY_PROFILES.includes(profile)) throw invalid('invalid_profile', `Unknown key profile "${profile}".`);
  const algorithm = input.algorithm ?? defaultAlgorithm(profile);
  if (!profileAllows(profile, algorithm)) throw invalid('invalid_algorithm', `The ${profile} profile makes no "${algorithm}" keys.`);
  if (!input.secret) throw new Error('generateKey: a secret is required to protect the private key');
  const days = input.expiresInDays;
  // OpenPGP counts a key's lifetime in a 32-bit number of seconds (~136 years).
  if (days !== undefined && (!Number.isInteger(days) || days < 1 || days * 86_400 > 0xffffffff)) {
    throw invalid('invalid_expiry', '`expires_in_days` must be a positive integer of at most 49710 days.');
  }
  // Whole seconds: OpenPGP timestamps have no fractions, and expiresAt must equal what the key says.
  const createdAt = new Date(Math.floor((input.date ?? new Date()).getTime() / 1000) * 1000);
  const keyExpirationTime = days ? days * 86_400 : 0;
  const expiresAt = keyExpirationTime ? new Date(createdAt.getTime() + keyExpirationTime * 1000) : null;

  // Curve25519 and both v6 profiles are made on Node's crypto (keygen.ts, v6/keygen.ts); RSA by OpenPGP.js.
  if (profile !== 'rfc4880' || algorithm === 'curve25519') {
    const made = { userId: userIdOf(input), secret: input.secret, s2kCountByte: GENERATION_S2K_COUNT_BYTE, createdAt, expiresIn: keyExpirationTime };
    const key = profile === 'rfc4880' ? curve25519Key(made) : v6Key({ ...made, profile });
    return {
      fingerprint: key.fingerprint,
      keyId: key.keyId,
      encryptionKeyIds: [key.subkeyId],
      publicArmored: armorKey('PUBLIC KEY', key.publicPackets),
      privateArmored: armorKey('PRIVATE KEY', key.privatePackets),
      profile,
      algorithm,
      createdAt,
      expiresAt,
    };
  }
  const pgp = await loadOpenpgp();
  const { privateKey } = await pgp.generateKey({
    type: 'rsa',
    rsaBits: RSA_BITS[algorithm],
    userIDs: [{ name: input.name, email: input.email }],
    passphrase: input.secret,
    keyExpirationTime,
    date: createdAt,
    format: 'object',
    config: { ...keygenConfig(pgp), s2kIterationCountByte: GENERATION_S2K_COUNT_BYTE },
  });
  return {
    fingerprint: privateKey.getFingerprint(),
    keyId: privateKey.getKeyID().toHex(),
    encryptionKeyIds: privateKey.subkeys.map((s) => s.getKeyID().toHex()),
    publicArmored: privateKey.toPublic().armor(),
    privateArmored: privateKey.armor(),
    profile,
    algorithm,
    createdAt,
    expiresAt,
  };
}

/** The user id packet's text, as OpenPGP.js forms it: "name <email>", either part left out when empty. */
const userIdOf = ({ name, email }: Pick<GenerateKeyInput, 'name' | 'email'>): string => [name, email && `<${email}>`].filter(Boolean).join(' ');

/**
 * A stored key's public half as parsed: OpenPGP.js reads v4 and rfc9580 keys; a post-quantum key (RFC
 * 9980), which OpenPGP.js cannot read, is read by v6/read-key.ts and used through v6/ (kem.ts, detached.ts).
 */
export type StoredPublicKey = openpgp.PublicKey | V6Key;
/** A stored key unlocked: OpenPGP.js's, or a post-quantum key's secrets. */
export type StoredPrivateKey = openpgp.PrivateKey | UnlockedV6Key;

export const isPqcKey = (key: StoredPublicKey): key is V6Key => !('keyPacket' in key);
export const isPqcPrivateKey = (key: StoredPrivateKey): key is UnlockedV6Key => 'secrets' in key;

/** The binary packets of an armored key, and whether its primary key is post-quantum (v6, ML-DSA-65+Ed25519). */
function keyPackets(armored: string): { bytes: Buffer; pqc: boolean } {
  const bytes = dearmorKey(armored);
  return { bytes, pqc: startsWithPqcPrimary(bytes) };
}

/**
 * Stored public keys as parsed, by their armored text (a changed key is a different entry). OpenPGP.js
 * records on a parsed key which of its self-signatures it has verified, so a key used again (every job
 * to the same recipient) is not verified again: ~1 ms of EdDSA per small encryption. Expiry and
 * revocation are still checked at each use, against that use's date.
 */
const parsedKeys = new LruCache<string, StoredPublicKey>({ max: 256 });

/** Parses a public key we stored ourselves (already validated when it was created or supplied), of any profile. */
export async function readStoredKey(armored: string): Promise<StoredPublicKey> {
  const cached = parsedKeys.get(armored);
  if (cached) return cached;
  const packets = keyPackets(armored);
  if (packets.pqc) return parsedKeys.set(armored, readV6Key(packets.bytes));
  const key = await (await loadOpenpgp()).readKey({ armoredKey: armored });
  return parsedKeys.set(armored, key.isPrivate() ? key.toPublic() : key);
}

/** readStoredKey for a key OpenPGP.js reads (v4 or rfc9580); a post-quantum key is an Error. */
export async function readStoredPublicKey(armored: string): Promise<openpgp.PublicKey> {
  const key = await readStoredKey(armored);
  if (isPqcKey(key)) throw new Error('readStoredPublicKey: a post-quantum key (use readStoredKey)');
  return key;
}

/**
 * Decrypts a stored private key, whichever S2K count locked it (rows made before GENERATION_S2K_COUNT_BYTE
 * carry count byte 224 and still open, just slower). A wrong secret is AppError 422 `wrong_passphrase`;
 * anything else (an unreadable block) is corrupt stored data and stays a plain Error.
 */
export async function unlockStoredKey(privateArmored: string, secret: string): Promise<StoredPrivateKey> {
  const packets = keyPackets(privateArmored);
  // unlockV6Key checks each secret against its public key; its lock (S2K usage 253) covers the public packet too.
  return packets.pqc ? unlockV6Key(packets.bytes, secret) : unlockPrivateKey(privateArmored, secret);
}

/** unlockStoredKey for a key OpenPGP.js reads (v4 or rfc9580). */
export async function unlockPrivateKey(privateArmored: string, secret: string): Promise<openpgp.PrivateKey> {
  const pgp = await loadOpenpgp();
  const privateKey = await pgp.readPrivateKey({ armoredKey: privateArmored });
  let unlocked: openpgp.PrivateKey;
  try {
    unlocked = await pgp.decryptKey({ privateKey, passphrase: secret });
  } catch (err) {
    if (/incorrect key passphrase/i.test(message(err))) throw invalid('wrong_passphrase', 'The key secret is wrong.');
    throw err;
  }
  // decryptKey checks only the primary key's secret against its public parameters; the v4 lock does not
  // cover public parameters, so check the subkeys too (key overwriting: a swapped public point must not
  // be used with our secret). Cheap next to a lock at the old S2K count.
  for (const sub of unlocked.subkeys) {
    try {
      await (sub.keyPacket as openpgp.SecretSubkeyPacket).validate();
    } catch {
      throw new Error('stored private key: a subkey does not match its public parameters');
    }
  }
  return unlocked;
}

export async function validEncryptionKeyIds(key: openpgp.Key, now: Date): Promise<string[]> {
  const ids: string[] = [];
  for (const k of key.getKeys()) {
    try {
      const found = await key.getEncryptionKey(k.getKeyID(), now);
      if (found.getKeyID().equals(k.getKeyID())) ids.push(k.getKeyID().toHex());
    } catch {
      /* revoked, expired, weak or not for encryption */
    }
  }
  return ids;
}

export async function expiryOf(key: openpgp.Key): Promise<Date | null> {
  try {
    const t = await key.getExpirationTime();
    return t instanceof Date ? t : null;
  } catch {
    return null;
  }
}

/** Tags and body lengths of a binary packet sequence (RFC 9580 §4.2), without parsing bodies. Stops at garbage. */
export function scanPackets(bytes: Uint8Array): { tag: number; length: number }[] {
  const tags: { tag: number; length: number }[] = [];
  let i = 0;
  while (i < bytes.length) {
    const h = bytes[i];
    if (!(h & 0x80)) break;
    let tag: number;
    let len: number;
    i++;
    if (h & 0x40) {
      tag = h & 0x3f;
      const b0 = bytes[i++] ?? 0;
      if (b0 < 192) len = b0;
      else if (b0 < 224) len = ((b0 - 192) << 8) + (bytes[i++] ?? 0) + 192;
      else if (b0 === 255) {
        len = ((bytes[i] << 24) >>> 0) + (bytes[i + 1] << 16) + (bytes[i + 2] << 8) + bytes[i + 3];
        i += 4;
      } else break; // partial lengths never appear in keys
    } else {
      tag = (h >> 2) & 0x0f;
      const lt = h & 3;
      if (lt === 3) break;
      const n = 1 << lt;
      len = 0;
      for (let j = 0; j < n; j++) len = len * 256 + (bytes[i + j] ?? 0);
      i += n;
    }
    tags.push({ tag, length: len });
    i += len;
  }
  return tags;
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
