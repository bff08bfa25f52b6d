import type * as openpgp from 'openpgp';
import { AppError, invalid, tooLarge } from '../errors';
import { armorKey } from './armor';
import {
  GENERATION_S2K_COUNT_BYTE,
  MAX_PUBLIC_KEY_BYTES,
  expiryOf,
  isPqcKey,
  loadOpenpgp,
  scanPackets,
  validEncryptionKeyIds,
  type StoredPublicKey,
} from './keys';
import { type KeyAlgorithm, type KeyProfile, defaultAlgorithm } from './profiles';
import { pqcEncryptionSubkeys } from './v6/kem';
import { readV6Key, type V6Key } from './v6/read-key';
import { publicV6Packets, relockV6Key, startsWithPqcPrimary } from './v6/relock';

/**
 * OpenPGP keys brought in from elsewhere (gpg, sq, another KMS): read, held to what we would generate,
 * and, for a secret key, unlocked with the passphrase it came with and locked again the way generated
 * generations are (a random secret, GENERATION_S2K_COUNT_BYTE). The passphrase it came with is used
 * once, here, and kept nowhere.
 *
 * The input is untrusted, and this runs on a thread that is stopped at a deadline (lib/pgp/untrusted.ts).
 * Within it, what a key may make us do is bounded before the work starts: its packets are counted and
 * measured before OpenPGP.js parses it (a key with 10,000 subkeys or a 1 MiB user id is refused without
 * being parsed), RSA moduli and public exponents before any signature is verified (checkKeyCost), and
 * the key derivation of every locked secret part before any is unlocked (checkProtection): no more than
 * the service would ask of itself. Post-quantum keys (RFC 9980), which OpenPGP.js cannot read, go
 * through the same packet limits and are then read, unlocked and locked again by v6/ (readPqcKey).
 */

/** Real keys have a handful of subkeys (gpg and sq make one to three). */
const MAX_SUBKEYS = 32;
/** Largest user id packet (RFC 9580 §5.11 sets no limit; real ones are under a hundred octets). */
const MAX_USER_ID_BYTES = 4096;
/** Largest signature packet: an RSA-16384 signature with its subpackets is under 3 KiB. */
export const MAX_SIGNATURE_PACKET_BYTES = 16 * 1024;
/** Packets of any kind in one key (user ids, attributes, signatures, subkeys). */
const MAX_KEY_PACKETS = 512;

/** Packet tags (RFC 9580 §5), fixed by the format. */
const TAG = { signature: 2, secretKey: 5, publicKey: 6, secretSubkey: 7, userId: 13, publicSubkey: 14 } as const;
const SECRET_TAGS = new Set<number>([TAG.secretKey, TAG.secretSubkey]);
/** Largest RSA modulus (gpg's --enable-large-rsa limit): verifying with more costs seconds per signature. */
const MAX_RSA_BITS = 16384;
/**
 * Largest RSA public exponent, in octets: real keys use 65537 (three octets). A verification's cost grows
 * with the exponent's length, and one as long as the modulus makes each signature check as costly as a
 * private-key operation.
 */
const MAX_RSA_EXPONENT_OCTETS = 4;
/**
 * The key derivation an imported secret key may ask for, per locked secret part: Argon2 no costlier than
 * OpenPGP.js's (and RFC 9580 §4.2.1's second recommended) choice of t=3, p=4, m=2^16 KiB (64 MiB), and
 * iterated-and-salted S2K up to the format's largest count (65,011,712 octets hashed, gpg's ceiling);
 * at most MAX_LOCKED_PARTS locked parts (gpg and sq lock a primary key and one to three subkeys).
 */
const MAX_ARGON2 = { t: 3, p: 4, encodedM: 16 } as const;
const MAX_LOCKED_PARTS = 4;

/** Hash algorithm ids too weak for a self-signature (RFC 9580 §9.5): MD5, SHA-1, RIPEMD-160. */
const WEAK_HASHES = new Set([1, 2, 3]);

export interface ImportedKey {
  /** The key held a secret part (a managed key) or only the public one (a recipient key). */
  secret: boolean;
  fingerprint: string;
  encryptionKeyIds: string[];
  publicArmored: string;
  /** Locked with the caller's `secret` (as generated generations are); null for a public-only key. */
  privateArmored: string | null;
  /** What the key is, as keys are listed: curve25519, rsa2048…rsa16384, ecdsa-p256, curve448. */
  algorithm: string;
  /** Its OpenPGP profile (profiles.ts), which a rotation keeps. */
  profile: KeyProfile;
  /** What a rotation generates next for it (one of the profile's). */
  rotationAlgorithm: KeyAlgorithm;
  expiresAt: Date | null;
  uidName: string;
  uidEmail: string;
}

const refuse = (code: string, message: string) => invalid(code, message);

/**
 * Reads an imported key (armored or binary) and checks it. For a secret key `keyPassphrase` unlocks it
 * (when it is locked) and `secret` locks it again. Errors (422 unless said): invalid_key (unreadable,
 * more than one key, past the packet limits, no valid self-signature), key_too_large (413),
 * weak_key_algorithm (RSA under 2048 bits, DSA, ElGamal), weak_self_signature (only MD5/SHA-1 ones),
 * key_revoked, key_expired, incomplete_secret_key, key_passphrase_required, wrong_key_passphrase,
 * key_mismatch (a secret part that does not belong to its public part), no_encryption_key.
 */
export async function readImportedKey(data: Uint8Array, input: { keyPassphrase?: string; secret: string; now: Date }): Promise<ImportedKey> {
  if (data.length === 0) throw refuse('invalid_key', 'The key is empty.');
  if (data.length > MAX_PUBLIC_KEY_BYTES) throw tooLarge('key_too_large', `The key is larger than ${MAX_PUBLIC_KEY_BYTES} bytes.`);
  const pgp = await loadOpenpgp();
  const parse = <T>(work: Promise<T>, what: string): Promise<T> =>
    work.catch((err: unknown) => {
      if (err instanceof AppError) throw err;
      throw refuse('invalid_key', `${what}: ${reason(err)}`);
    });

  const text = Buffer.from(data.subarray(0, 64)).toString('latin1').trimStart();
  const binary = text.startsWith('-----BEGIN PGP')
    ? await parse(
        pgp.unarmor(Buffer.from(data).toString('utf8')).then(async ({ data: body }) => new Uint8Array(await new Response(body).arrayBuffer())),
        'The armored key cannot be read',
      )
    : data;
  checkPacketLimits(binary);
  if (startsWithPqcPrimary(binary)) return readPqcKey(binary, input);

  const keys = await parse(pgp.readKeys({ binaryKeys: binary }), 'Not a readable OpenPGP key');
  if (keys.length !== 1) throw refuse('invalid_key', `Expected exactly one key, found ${keys.length}.`);
  const key = keys[0];

  checkKeyCost(key);
  checkAlgorithms(key);
  checkSelfSignatureHashes(key);
  if (await parse(key.isRevoked(undefined, undefined, input.now), 'The key cannot be checked')) throw refuse('key_revoked', 'The key is revoked.');
  const primary = await parse(key.getPrimaryUser(input.now), 'The key has no valid self-signature').catch((err: unknown) => {
    if (err instanceof AppError && /expired/i.test(err.message)) throw refuse('key_expired', 'The key has expired.');
    throw err;
  });
  const expiresAt = await expiryOf(key);
  if (expiresAt && expiresAt <= input.now) throw refuse('key_expired', `The key expired at ${expiresAt.toISOString()}.`);

  const encryptionKeyIds = await parse(validEncryptionKeyIds(key, input.now), 'The key cannot be checked');
  if (encryptionKeyIds.length === 0)
    throw refuse('no_encryption_key', 'The key has no encryption-capable subkey that is valid now (revoked, expired, too weak or sign-only).');

  const info = key.getAlgorithmInfo();
  const profile: KeyProfile = key.keyPacket.version === 6 ? 'rfc9580' : 'rfc4880'; // post-quantum keys went to readPqcKey
  const common = {
    fingerprint: key.getFingerprint(),
    encryptionKeyIds,
    publicArmored: key.toPublic().armor(),
    algorithm: algorithmName(info),
    profile,
    rotationAlgorithm: profile === 'rfc4880' ? rotationAlgorithm(info) : defaultAlgorithm(profile),
    expiresAt,
    uidName: primary.user.userID?.name ?? '',
    uidEmail: primary.user.userID?.email ?? '',
  };
  if (!key.isPrivate()) return { ...common, secret: false, privateArmored: null };
  const unlocked = await unlockImported(pgp, key, input.keyPassphrase, parse);
  const relocked = await parse(
    pgp.encryptKey({ privateKey: unlocked, passphrase: input.secret, config: { s2kIterationCountByte: GENERATION_S2K_COUNT_BYTE, aeadProtect: false } }),
    'The key cannot be locked',
  );
  return { ...common, secret: true, privateArmored: relocked.armor() };
}

export interface RecipientKey {
  key: StoredPublicKey;
  fingerprint: string;
  /** Encryption-capable (sub)keys that are valid now. */
  encryptionKeyIds: string[];
  expiresAt: Date | null;
  userIds: string[];
}

/**
 * Validates a public key a user supplies to encrypt to: one certificate within the import's limits, no
 * secret material, at least one encryption-capable (sub)key that is valid now (not revoked, not expired,
 * strong enough). Errors: 413 public_key_too_large; 422 invalid_public_key, private_key_supplied,
 * no_encryption_key.
 */
export async function readRecipientKey(armored: string, now = new Date()): Promise<RecipientKey> {
  const key = await readSuppliedPublicKey(armored);
  if (isPqcKey(key)) {
    const ids = pqcEncryptionKeyIds(key, now);
    if (ids.length === 0) throw invalid('no_encryption_key', `The key cannot be encrypted to: ${pqcUnusable(key, now)}.`);
    return { key, fingerprint: key.fingerprint, encryptionKeyIds: ids, expiresAt: key.primary.expiresAt, userIds: key.userIds.map((u) => u.userId) };
  }
  const ids = await validEncryptionKeyIds(key, now);
  if (ids.length === 0) {
    const why = await key.getEncryptionKey(undefined, now).then(
      () => 'no valid encryption-capable key',
      (err: unknown) => reason(err),
    );
    throw invalid('no_encryption_key', `The key cannot be encrypted to (revoked, expired, too weak or sign-only): ${why}`);
  }
  return {
    key,
    fingerprint: key.getFingerprint(),
    encryptionKeyIds: ids,
    expiresAt: await expiryOf(key),
    userIds: key.getUserIDs(),
  };
}

/**
 * One armored public key a caller supplies (to encrypt to or to verify with), read within the import's
 * limits (checkPacketLimits, checkKeyCost). 413 public_key_too_large; 422 invalid_public_key,
 * private_key_supplied.
 */
export async function readSuppliedPublicKey(armored: string): Promise<StoredPublicKey> {
  if (typeof armored !== 'string' || !armored.trim()) throw invalid('invalid_public_key', 'The public key is empty.');
  if (Buffer.byteLength(armored) > MAX_PUBLIC_KEY_BYTES) throw tooLarge('public_key_too_large', `The public key is larger than ${MAX_PUBLIC_KEY_BYTES} bytes.`);
  // Checked before parsing so the message is right even when the private block itself is malformed.
  const secretSupplied = () => invalid('private_key_supplied', 'A private key was supplied; send only the public key.');
  if (/-----BEGIN PGP PRIVATE KEY BLOCK-----/.test(armored)) throw secretSupplied();
  const pgp = await loadOpenpgp();
  try {
    const { data, type } = await pgp.unarmor(armored);
    if (type !== pgp.enums.armor.publicKey) throw invalid('invalid_public_key', 'Expected an armored PGP PUBLIC KEY BLOCK.');
    const binary = new Uint8Array(await new Response(data).arrayBuffer());
    if (scanPackets(binary).some((p) => SECRET_TAGS.has(p.tag))) throw secretSupplied();
    checkPacketLimits(binary, 'public key');
    if (startsWithPqcPrimary(binary)) return readV6Key(binary);
    const keys = await pgp.readKeys({ binaryKeys: binary });
    if (keys.length !== 1 || keys[0].isPrivate()) throw invalid('invalid_public_key', `Expected exactly one public key, found ${keys.length}.`);
    checkKeyCost(keys[0]);
    return keys[0];
  } catch (err) {
    if (err instanceof AppError) throw err.code === 'invalid_key' ? invalid('invalid_public_key', err.message) : err;
    throw invalid('invalid_public_key', `Not a readable OpenPGP public key: ${reason(err)}`);
  }
}

/**
 * A post-quantum key (v6, ML-DSA-65+Ed25519 primary), as readImportedKey has it: every self-signature
 * verified by v6/read-key.ts, held to the same checks (revoked, expired, an encryption subkey valid
 * now), a secret key unlocked with `keyPassphrase` and locked again with `secret` (v6/relock.ts).
 */
function readPqcKey(binary: Uint8Array, input: { keyPassphrase?: string; secret: string; now: Date }): ImportedKey {
  const key = readV6Key(binary, input.now);
  if (key.primary.revoked) throw refuse('key_revoked', 'The key is revoked.');
  const expiresAt = key.primary.expiresAt;
  if (expiresAt && expiresAt <= input.now) throw refuse('key_expired', `The key expired at ${expiresAt.toISOString()}.`);
  const encryptionKeyIds = pqcEncryptionKeyIds(key, input.now);
  if (encryptionKeyIds.length === 0)
    throw refuse('no_encryption_key', `The key has no encryption-capable subkey that is valid now: ${pqcUnusable(key, input.now)}.`);
  const primaryUser = key.userIds.find((u) => u.primary) ?? key.userIds[0];
  const uid = splitUserId(primaryUser?.userId ?? '');
  const common = {
    fingerprint: key.fingerprint,
    encryptionKeyIds,
    publicArmored: armorKey('PUBLIC KEY', publicV6Packets(binary)),
    algorithm: defaultAlgorithm('pqc'),
    profile: 'pqc' as const,
    rotationAlgorithm: defaultAlgorithm('pqc'),
    expiresAt,
    uidName: uid.name,
    uidEmail: uid.email,
  };
  if (!key.secret) return { ...common, secret: false, privateArmored: null };
  const relocked = relockV6Key(binary, input.keyPassphrase, input.secret, GENERATION_S2K_COUNT_BYTE, {
    passphraseRequired: () => refuse('key_passphrase_required', 'The key is protected: send its passphrase as key_passphrase.'),
    wrongPassphrase: () => refuse('wrong_key_passphrase', 'The key passphrase is wrong.'),
    mismatch,
    unsupported: (why) =>
      refuse('key_protection_unsupported', `The key's protection cannot be read here (${why}); export it again with another protection before importing.`),
    tooCostly: (why) => refuse('key_protection_too_costly', `${why}; unlock it and export it again with a standard protection before importing.`),
  });
  return { ...common, secret: true, privateArmored: armorKey('PRIVATE KEY', relocked) };
}

/** The key ids of a post-quantum key's ML-KEM-768+X25519 subkeys that may encrypt now. */
const pqcEncryptionKeyIds = (key: V6Key, now: Date): string[] => pqcEncryptionSubkeys(key, now).map((k) => k.keyId);

/** Why a post-quantum key has no encryption subkey that is valid now. */
function pqcUnusable(key: V6Key, now: Date): string {
  if (key.primary.revoked) return 'it is revoked';
  if (key.primary.expiresAt && key.primary.expiresAt <= now) return `it expired at ${key.primary.expiresAt.toISOString()}`;
  return 'no ML-KEM-768+X25519 subkey for encryption that is valid now (revoked, expired or sign-only)';
}

/** A user id's name and email, from the usual "Name <email>" form (either part may be missing). */
function splitUserId(userId: string): { name: string; email: string } {
  const m = /^(.*?)\s*<([^<>]*)>\s*$/.exec(userId);
  if (m) return { name: m[1].trim(), email: m[2].trim() };
  return userId.includes('@') && !/\s/.test(userId.trim()) ? { name: '', email: userId.trim() } : { name: userId.trim(), email: '' };
}

/** Counts and sizes packets before any parse: what OpenPGP.js would otherwise verify one by one. */
function checkPacketLimits(binary: Uint8Array, what: 'key' | 'public key' = 'key'): void {
  const packets = scanPackets(binary);
  if (packets.length === 0) throw refuse('invalid_key', `Not a readable OpenPGP ${what}: no packets.`);
  if (packets.length > MAX_KEY_PACKETS) throw refuse('invalid_key', `The ${what} has more than ${MAX_KEY_PACKETS} packets.`);
  const subkeys = packets.filter((p) => p.tag === TAG.publicSubkey || p.tag === TAG.secretSubkey).length;
  if (subkeys > MAX_SUBKEYS) throw refuse('invalid_key', `The ${what} has ${subkeys} subkeys; at most ${MAX_SUBKEYS} are accepted.`);
  for (const p of packets) {
    if (p.tag === TAG.userId && p.length > MAX_USER_ID_BYTES)
      throw refuse('invalid_key', `A user id of the ${what} is longer than ${MAX_USER_ID_BYTES} octets.`);
    if (p.tag === TAG.signature && p.length > MAX_SIGNATURE_PACKET_BYTES)
      throw refuse('invalid_key', `A signature of the ${what} is longer than ${MAX_SIGNATURE_PACKET_BYTES} octets.`);
  }
  if (packets[0].tag !== TAG.publicKey && packets[0].tag !== TAG.secretKey)
    throw refuse('invalid_key', `Not an OpenPGP ${what}: it does not begin with a key packet.`);
}

/**
 * What verifying the key's signatures may cost, bounded before any is verified: RSA moduli of at most
 * MAX_RSA_BITS and public exponents of at most MAX_RSA_EXPONENT_OCTETS. For every key read from a caller.
 */
function checkKeyCost(key: openpgp.Key): void {
  for (const k of key.getKeys()) {
    const info = k.getAlgorithmInfo();
    if (!info.algorithm.startsWith('rsa')) continue;
    if ((info.bits ?? 0) > MAX_RSA_BITS) throw refuse('invalid_key', `The key uses RSA with ${info.bits} bits; at most ${MAX_RSA_BITS} are accepted.`);
    const { e } = (k.keyPacket as unknown as { publicParams: { e?: Uint8Array } }).publicParams;
    if (!e || e.length > MAX_RSA_EXPONENT_OCTETS)
      throw refuse('invalid_key', `The key's RSA public exponent is longer than ${MAX_RSA_EXPONENT_OCTETS} octets (real keys use 65537).`);
  }
}

/** What the S2K specifier of a locked secret part asks for (OpenPGP.js's parsed GenericS2K or Argon2S2K). */
interface S2kSpec {
  type: string;
  /** Iterated and salted: the coded count octet. */
  c?: number;
  /** Argon2: passes, parallelism, memory exponent (2^encodedM KiB). */
  t?: number;
  p?: number;
  encodedM?: number;
}

/**
 * The key derivation of each locked secret part, bounded before any is unlocked: the S2K specifier is
 * not covered by any signature, so a key whose signatures all verify may still ask for hours of Argon2 or
 * gibibytes of memory. 422 key_protection_too_costly names what to re-export with.
 */
function checkProtection(parts: (openpgp.SecretKeyPacket | openpgp.SecretSubkeyPacket)[]): void {
  const locked = parts.filter((p) => !p.isDecrypted());
  const tooCostly = (what: string) =>
    refuse(
      'key_protection_too_costly',
      `${what}; unlock it and export it again with a standard protection (gpg --export-secret-keys, or sq key password) before importing.`,
    );
  if (locked.length > MAX_LOCKED_PARTS) throw tooCostly(`The key has ${locked.length} locked secret parts; at most ${MAX_LOCKED_PARTS} are accepted`);
  for (const part of locked) {
    const s2k = (part as unknown as { s2k: S2kSpec | null }).s2k;
    if (s2k?.type !== 'argon2') continue; // simple, salted and iterated counts (at most 65,011,712 octets) are all within bounds
    const { t = Infinity, p = Infinity, encodedM = Infinity } = s2k;
    if (t > MAX_ARGON2.t || p > MAX_ARGON2.p || encodedM > MAX_ARGON2.encodedM)
      throw tooCostly(
        `The key is locked with Argon2 t=${t}, p=${p}, m=2^${encodedM} KiB; at most t=${MAX_ARGON2.t}, p=${MAX_ARGON2.p}, m=2^${MAX_ARGON2.encodedM} KiB are accepted`,
      );
  }
}

/** RSA of 2048 bits or more, and elliptic curves; never DSA or ElGamal, on the primary key or any subkey. */
function checkAlgorithms(key: openpgp.Key): void {
  for (const k of key.getKeys()) {
    const info = k.getAlgorithmInfo();
    if (info.algorithm === 'dsa' || info.algorithm === 'elgamal') {
      throw refuse(
        'weak_key_algorithm',
        `The key uses ${info.algorithm === 'dsa' ? 'DSA' : 'ElGamal'}, which is not accepted; use RSA (2048 bits or more) or Curve25519.`,
      );
    }
    if (info.algorithm.startsWith('rsa') && (info.bits ?? 0) < 2048) {
      throw refuse('weak_key_algorithm', `The key uses RSA with ${info.bits} bits; at least 2048 are required.`);
    }
  }
}

/** At least one self-certification of a user id made with SHA-256 or stronger (not MD5, SHA-1 or RIPEMD-160). */
function checkSelfSignatureHashes(key: openpgp.Key): void {
  const hashes = key.users.flatMap((u) => u.selfCertifications.map((s) => s.hashAlgorithm));
  if (hashes.length > 0 && hashes.every((h) => h !== null && WEAK_HASHES.has(h))) {
    throw refuse(
      'weak_self_signature',
      'Every self-signature of the key uses SHA-1 or MD5; re-sign it with SHA-256 or stronger (gpg --cert-digest-algo SHA256).',
    );
  }
}

async function unlockImported(
  pgp: typeof openpgp,
  key: openpgp.Key,
  passphrase: string | undefined,
  parse: <T>(w: Promise<T>, what: string) => Promise<T>,
): Promise<openpgp.PrivateKey> {
  const priv = key as openpgp.PrivateKey;
  const secretPackets = priv.getKeys().map((k) => k.keyPacket as openpgp.SecretKeyPacket | openpgp.SecretSubkeyPacket);
  if (secretPackets.some((p) => typeof p.isDummy !== 'function' || p.isDummy())) {
    throw refuse(
      'incomplete_secret_key',
      'A secret part of the key is missing (exported with --export-secret-subkeys?); export it whole with --export-secret-keys.',
    );
  }
  let unlocked = priv;
  if (!priv.isDecrypted()) {
    if (!passphrase) throw refuse('key_passphrase_required', 'The key is protected: send its passphrase as key_passphrase.');
    checkProtection(secretPackets);
    const config = { maxArgon2MemoryExponent: MAX_ARGON2.encodedM };
    unlocked = await parse(pgp.decryptKey({ privateKey: priv, passphrase, config }), 'The key cannot be unlocked').catch((err: unknown) => {
      if (err instanceof AppError && /incorrect key passphrase/i.test(err.message)) throw refuse('wrong_key_passphrase', 'The key passphrase is wrong.');
      if (err instanceof AppError && /invalid/i.test(err.message)) throw mismatch();
      throw err;
    });
  }
  // Every secret part must belong to its public part (key overwriting; a key put together from two).
  try {
    for (const k of unlocked.getKeys()) await (k.keyPacket as openpgp.SecretKeyPacket).validate();
  } catch {
    throw mismatch();
  }
  return unlocked;
}

const mismatch = () => refuse('key_mismatch', 'The secret key does not match its public key.');

function algorithmName(info: openpgp.AlgorithmInfo): string {
  if (info.algorithm.startsWith('rsa')) return `rsa${info.bits}`;
  if (info.algorithm === 'eddsaLegacy' || info.algorithm === 'ed25519') return 'curve25519';
  if (info.algorithm === 'ed448') return 'curve448';
  return `${info.algorithm}-${info.curve ?? 'unknown'}`.toLowerCase();
}

function rotationAlgorithm(info: openpgp.AlgorithmInfo): KeyAlgorithm {
  if (!info.algorithm.startsWith('rsa')) return 'curve25519';
  return (info.bits ?? 0) >= 4096 ? 'rsa4096' : 'rsa3072';
}

function reason(err: unknown): string {
  const text = err instanceof Error ? err.message : String(err);
  return text.endsWith('.') ? text : `${text}.`;
}
