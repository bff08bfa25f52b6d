import { createCipheriv, createDecipheriv, createHash, diffieHellman, hkdfSync, randomBytes, timingSafeEqual, type KeyObject } from 'node:crypto';
import { hashRaw } from '@node-rs/argon2';
import { generateRawKeyPair, privateKeyFromRaw, publicKeyFromRaw, rawPublicKey } from './curve25519';
import { invalid } from './errors';

/**
 * The lineage unlock model (DESIGN.md, "Keys and secrets"). A key lineage has an X25519 "unlock" key
 * pair. Its private half is stored encrypted under argon2id(passphrase). Each generation's OpenPGP key
 * is protected by a random secret sealed to the lineage public key (ECIES: ephemeral X25519, HKDF-SHA256,
 * AES-256-GCM). Rotation seals a new secret with the public key alone, without the passphrase;
 * decryption opens the unlock key with the passphrase, then the generation's sealed secret.
 *
 * Formats (strings, safe for a text column):
 * - lockedPrivate: JSON `{v:1, kdf:'argon2id', m, t, p, salt, check, iv, ct, tag}` (base64url fields).
 *   argon2id gives 64 bytes: the first 32 are the AES-256-GCM key, the second 32 hash to `check`, which
 *   tells a wrong passphrase (422 `wrong_passphrase`) from a tampered lock (plain Error). The check does
 *   not help guessing: the GCM tag already lets anyone with the lock test a passphrase at the same cost.
 *   (A changed salt, parameter or check still reads as a wrong passphrase: only ciphertext, iv and tag
 *   changes are provably corruption.) Passphrases are NFC-normalised, so composed and decomposed
 *   spellings of the same text both work.
 * - sealed secret: `ls1.<ephemeral public>.<iv>.<ciphertext>.<tag>` (base64url).
 */

export interface LineageLock {
  /** X25519 public key, 32 bytes, base64. */
  publicKey: string;
  lockedPrivate: string;
}

/** An opened lineage key. Hold it only as long as a job needs it. */
export interface UnlockKey {
  readonly publicKey: string;
  /** @internal */
  readonly privateKey: KeyObject;
}

export interface KdfParams {
  /** Memory in KiB. */
  memoryKib: number;
  timeCost: number;
  parallelism: number;
}

/**
 * The one default (LINEAGE_KDF_MEMORY_KIB defaults to its memory): OWASP's argon2id baseline of 19 MiB
 * with one pass more (t=3). Raise the memory where the API's memory allows; stored locks keep theirs.
 */
export const DEFAULT_KDF: KdfParams = { memoryKib: 19_456, timeCost: 3, parallelism: 1 };
/** Floor for new locks in production (OWASP minimum for argon2id). Tests may go lower elsewhere. */
const PRODUCTION_KDF_FLOOR: KdfParams = { memoryKib: 19_456, timeCost: 2, parallelism: 1 };
/** Bounds on what a stored lock may ask for, so a corrupt or hostile lock cannot exhaust memory. */
const KDF_LIMITS = { memoryKib: [8, 1 << 20], timeCost: [1, 10], parallelism: [1, 8] } as const;

// Set from configuration (LINEAGE_KDF_MEMORY_KIB) when the container is built.
let kdf: KdfParams = DEFAULT_KDF;

function isProduction(): boolean {
  return process.env.NODE_ENV === 'production';
}

function checkKdf(p: KdfParams): KdfParams {
  for (const name of ['memoryKib', 'timeCost', 'parallelism'] as const) {
    const [min, max] = KDF_LIMITS[name];
    if (!Number.isInteger(p[name]) || p[name] < min || p[name] > max) {
      throw new Error(`lineage kdf: ${name} must be an integer in [${min}, ${max}]`);
    }
  }
  if (p.memoryKib < 8 * p.parallelism) throw new Error('lineage kdf: memoryKib must be at least 8 × parallelism');
  if (isProduction() && (p.memoryKib < PRODUCTION_KDF_FLOOR.memoryKib || p.timeCost < PRODUCTION_KDF_FLOOR.timeCost)) {
    const { memoryKib, timeCost } = PRODUCTION_KDF_FLOOR;
    throw new Error(`lineage kdf: below the production floor (m=${memoryKib} KiB, t=${timeCost})`);
  }
  return p;
}

/** Parameters for new locks (tests lower them; production refuses anything below the floor). */
export function setLineageKdf(params: Partial<KdfParams>): KdfParams {
  kdf = checkKdf({ ...kdf, ...params });
  return kdf;
}

export function lineageKdf(): KdfParams {
  return { ...kdf };
}

/** 32 random bytes, base64url: protects one generation's OpenPGP private key. */
export function randomSecret(): string {
  return randomBytes(32).toString('base64url');
}

// ---------------------------------------------------------------------------------------- lock

interface LockedPrivateV1 {
  v: 1;
  kdf: 'argon2id';
  m: number;
  t: number;
  p: number;
  salt: string;
  check: string;
  iv: string;
  ct: string;
  tag: string;
}

const LOCK_INFO = 'kms/lineage-lock/v1';

export async function createLineageLock(passphrase: string): Promise<LineageLock> {
  requirePassphrase(passphrase);
  const { d, x } = generateRawKeyPair('x25519');
  return { publicKey: x.toString('base64'), lockedPrivate: await lockPrivate(d, x, passphrase) };
}

/** Wrong passphrase → AppError 422 `wrong_passphrase`; a malformed or tampered lock → plain Error. */
export async function openLineageLock(lock: LineageLock, passphrase: string): Promise<UnlockKey> {
  const pub = decodePublic(lock.publicKey);
  const locked = parseLocked(lock.lockedPrivate);
  const params: KdfParams = { memoryKib: locked.m, timeCost: locked.t, parallelism: locked.p };
  const salt = b64(locked.salt, 16);
  const { aesKey, check } = await deriveKeys(passphrase, salt, params);
  if (!timingSafeEqual(check, b64(locked.check, 32))) throw invalid('wrong_passphrase', 'The passphrase is wrong.');
  let scalar: Buffer;
  try {
    const decipher = createDecipheriv('aes-256-gcm', aesKey, b64(locked.iv, 12));
    decipher.setAAD(lockAad(pub, params, salt));
    decipher.setAuthTag(b64(locked.tag, 16));
    scalar = Buffer.concat([decipher.update(b64(locked.ct, 32)), decipher.final()]);
  } catch {
    throw new Error('lineage lock: the locked private key is corrupt (authentication failed)');
  }
  const privateKey = privateKeyFromRaw('x25519', scalar);
  if (!rawPublicKey('x25519', privateKey).equals(pub)) {
    throw new Error('lineage lock: private key does not match the public key');
  }
  return { publicKey: lock.publicKey, privateKey };
}

async function lockPrivate(scalar: Buffer, pub: Buffer, passphrase: string): Promise<string> {
  const params = kdf;
  const salt = randomBytes(16);
  const { aesKey, check } = await deriveKeys(passphrase, salt, params);
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', aesKey, iv);
  cipher.setAAD(lockAad(pub, params, salt));
  const ct = Buffer.concat([cipher.update(scalar), cipher.final()]);
  const body: LockedPrivateV1 = {
    v: 1,
    kdf: 'argon2id',
    m: params.memoryKib,
    t: params.timeCost,
    p: params.parallelism,
    salt: salt.toString('base64url'),
    check: check.toString('base64url'),
    iv: iv.toString('base64url'),
    ct: ct.toString('base64url'),
    tag: cipher.getAuthTag().toString('base64url'),
  };
  return JSON.stringify(body);
}

async function deriveKeys(passphrase: string, salt: Buffer, p: KdfParams): Promise<{ aesKey: Buffer; check: Buffer }> {
  const out = await hashRaw(passphrase.normalize('NFC'), {
    algorithm: 2, // Argon2id (a const enum in the typings, which isolatedModules cannot import)
    memoryCost: p.memoryKib,
    timeCost: p.timeCost,
    parallelism: p.parallelism,
    outputLen: 64,
    salt,
  });
  return { aesKey: out.subarray(0, 32), check: createHash('sha256').update(out.subarray(32)).digest() };
}

/** Binds the ciphertext to its public key and KDF parameters: neither can be swapped unnoticed. */
function lockAad(pub: Buffer, p: KdfParams, salt: Buffer): Buffer {
  return Buffer.concat([Buffer.from(`${LOCK_INFO}|m=${p.memoryKib},t=${p.timeCost},p=${p.parallelism}|`), pub, salt]);
}

function parseLocked(text: string): LockedPrivateV1 {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw new Error('lineage lock: not JSON');
  }
  const o = v as Partial<LockedPrivateV1> | null;
  if (!o || o.v !== 1 || o.kdf !== 'argon2id') throw new Error('lineage lock: unknown version or kdf');
  for (const f of ['salt', 'check', 'iv', 'ct', 'tag'] as const) {
    if (typeof o[f] !== 'string') throw new Error(`lineage lock: missing ${f}`);
  }
  // Stored parameters are bounded too (not the production floor: old locks must keep opening).
  for (const [name, value] of [
    ['memoryKib', o.m],
    ['timeCost', o.t],
    ['parallelism', o.p],
  ] as const) {
    const [min, max] = KDF_LIMITS[name];
    if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
      throw new Error(`lineage lock: bad ${name}`);
    }
  }
  return o as LockedPrivateV1;
}

function requirePassphrase(passphrase: string): void {
  if (typeof passphrase !== 'string' || passphrase.length === 0) throw invalid('invalid_passphrase', 'A passphrase is required.');
}

// ---------------------------------------------------------------------------------------- seal

const SEAL_INFO = 'kms/lineage-seal/v1';
const SEAL_PREFIX = 'ls1';

/**
 * Seals `secret` to a lineage public key. `aad` names what the secret belongs to (e.g. the generation's
 * id and fingerprint), so a sealed value cannot be moved to another row; opening needs the same `aad`.
 */
export function sealSecret(publicKey: string, secret: string, aad: string): string {
  const recipient = decodePublic(publicKey);
  const eph = generateRawKeyPair('x25519');
  const key = sealKey(diffieHellman({ privateKey: eph.privateKey, publicKey: publicKeyFromRaw('x25519', recipient) }), eph.x, recipient);
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', key, iv);
  cipher.setAAD(sealAad(aad));
  const ct = Buffer.concat([cipher.update(secret, 'utf8'), cipher.final()]);
  const fields = [eph.x, iv, ct, cipher.getAuthTag()].map((b) => b.toString('base64url'));
  return [SEAL_PREFIX, ...fields].join('.');
}

/** Opens a sealed secret; a wrong key, wrong `aad` or tampering throws a plain Error (corrupt data). */
export function openSealedSecret(unlock: UnlockKey, sealed: string, aad: string): string {
  const parts = sealed.split('.');
  if (parts.length !== 5 || parts[0] !== SEAL_PREFIX) throw new Error('sealed secret: unknown format');
  const [, e, i, c, t] = parts as [string, string, string, string, string];
  const ephPub = b64(e, 32);
  const recipient = decodePublic(unlock.publicKey);
  try {
    const key = sealKey(diffieHellman({ privateKey: unlock.privateKey, publicKey: publicKeyFromRaw('x25519', ephPub) }), ephPub, recipient);
    const decipher = createDecipheriv('aes-256-gcm', key, b64(i, 12));
    decipher.setAAD(sealAad(aad));
    decipher.setAuthTag(b64(t, 16));
    return Buffer.concat([decipher.update(Buffer.from(c, 'base64url')), decipher.final()]).toString('utf8');
  } catch {
    throw new Error('sealed secret: cannot be opened (wrong lineage key, wrong context, or corrupt)');
  }
}

function sealKey(shared: Buffer, ephPub: Buffer, recipient: Buffer): Buffer {
  // Both public keys in the salt bind the key to this exchange (as in HPKE's kem_context).
  return Buffer.from(hkdfSync('sha256', shared, Buffer.concat([ephPub, recipient]), SEAL_INFO, 32));
}

function sealAad(aad: string): Buffer {
  return Buffer.from(`${SEAL_INFO}\0${aad}`, 'utf8');
}

function decodePublic(publicKey: string): Buffer {
  const raw = Buffer.from(publicKey, 'base64');
  if (raw.length !== 32 || raw.toString('base64') !== publicKey) throw new Error('lineage public key: not 32 bytes of base64');
  return raw;
}

function b64(text: string, length: number): Buffer {
  const raw = Buffer.from(text, 'base64url');
  if (raw.length !== length) throw new Error(`lineage: a field has ${raw.length} bytes, expected ${length}`);
  return raw;
}
