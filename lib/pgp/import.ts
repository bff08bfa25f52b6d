import type * as openpgp from 'openpgp';
import { AppError, invalid, tooLarge } from '../errors';
import { within } from '../within';
import { GENERATION_S2K_COUNT_BYTE, MAX_PUBLIC_KEY_BYTES, expiryOf, loadOpenpgp, scanPackets, validEncryptionKeyIds, type KeyAlgorithm } from './keys';

/**
 * OpenPGP keys brought in from elsewhere (gpg, sq, another KMS): read, held to what we would generate,
 * and, for a secret key, unlocked with the passphrase it came with and locked again the way generated
 * generations are (a random secret, GENERATION_S2K_COUNT_BYTE). The passphrase it came with is used
 * once, here, and kept nowhere.
 *
 * The input is untrusted: its packets are counted and measured before OpenPGP.js parses it (a key with
 * 10,000 subkeys or a 1 MiB user id is refused without being parsed), and every call into OpenPGP.js
 * runs under KEY_PARSE_MS.
 */

/** Every call into OpenPGP.js about an imported key answers within this, or the key is refused (422). */
export const KEY_PARSE_MS = 10_000;
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
  /** What a rotation generates next for it (one of ours). */
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
    within(work, KEY_PARSE_MS).catch((err: unknown) => {
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

  const keys = await parse(pgp.readKeys({ binaryKeys: binary }), 'Not a readable OpenPGP key');
  if (keys.length !== 1) throw refuse('invalid_key', `Expected exactly one key, found ${keys.length}.`);
  const key = keys[0];

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
  const common = {
    fingerprint: key.getFingerprint(),
    encryptionKeyIds,
    publicArmored: key.toPublic().armor(),
    algorithm: algorithmName(info),
    rotationAlgorithm: rotationAlgorithm(info),
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

/** Counts and sizes packets before any parse: what OpenPGP.js would otherwise verify one by one. */
export function checkPacketLimits(binary: Uint8Array): void {
  const packets = scanPackets(binary);
  if (packets.length === 0) throw refuse('invalid_key', 'Not a readable OpenPGP key: no packets.');
  if (packets.length > MAX_KEY_PACKETS) throw refuse('invalid_key', `The key has more than ${MAX_KEY_PACKETS} packets.`);
  const subkeys = packets.filter((p) => p.tag === TAG.publicSubkey || p.tag === TAG.secretSubkey).length;
  if (subkeys > MAX_SUBKEYS) throw refuse('invalid_key', `The key has ${subkeys} subkeys; at most ${MAX_SUBKEYS} are accepted.`);
  for (const p of packets) {
    if (p.tag === TAG.userId && p.length > MAX_USER_ID_BYTES) throw refuse('invalid_key', `A user id of the key is longer than ${MAX_USER_ID_BYTES} octets.`);
    if (p.tag === TAG.signature && p.length > MAX_SIGNATURE_PACKET_BYTES)
      throw refuse('invalid_key', `A signature of the key is longer than ${MAX_SIGNATURE_PACKET_BYTES} octets.`);
  }
  if (packets[0].tag !== TAG.publicKey && packets[0].tag !== TAG.secretKey)
    throw refuse('invalid_key', 'Not an OpenPGP key: it does not begin with a key packet.');
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
    unlocked = await parse(pgp.decryptKey({ privateKey: priv, passphrase }), 'The key cannot be unlocked').catch((err: unknown) => {
      if (err instanceof AppError && /incorrect key passphrase/i.test(err.message)) throw refuse('wrong_key_passphrase', 'The key passphrase is wrong.');
      if (err instanceof AppError && /invalid/i.test(err.message)) throw mismatch();
      throw err;
    });
  }
  // Every secret part must belong to its public part (key overwriting; a key put together from two).
  try {
    for (const k of unlocked.getKeys()) await within((k.keyPacket as openpgp.SecretKeyPacket).validate(), KEY_PARSE_MS);
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
