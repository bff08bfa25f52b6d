import * as crypto from 'node:crypto';
import { Cursor } from './wire';

/**
 * The lock on a v6 secret key packet's material (RFC 9580 §5.5.3). Keys made here use S2K usage 253:
 * AES-256 in OCB (the AEAD mode every RFC 9580 implementation must have, §5.13.2; upstream OpenPGP.js and
 * Proton's fork both read it, and Node has it natively) under HKDF-SHA256 of an iterated and salted
 * SHA-256 S2K at count byte 0, with the packet's tag and public part as associated data. The AEAD tag
 * authenticates the material and binds it to its public key, which the older usage 254 (CFB with a SHA-1
 * check) does not. Count byte 0 (1 KiB hashed) because the secret is 256 random bits from randomSecret()
 * (see ../keys.ts, GENERATION_S2K_COUNT_BYTE): stretching buys nothing. Argon2 (§3.7.1.4) would be the
 * choice for a human passphrase; it is not what this lock is for.
 *
 * Read: usage 0 (unprotected), 253 with OCB or GCM, 254 (CFB, SHA-1 check); iterated and salted S2K,
 * and Argon2 (§3.7.1.4) up to MAX_ARGON2. Usage 255 and bare cipher ids are forbidden for v6 keys
 * (§5.5.3) and refused.
 */

const USAGE_AEAD = 253;
const USAGE_CFB = 254;
const S2K_ITERATED = 3;
const S2K_ARGON2 = 4;
/**
 * The costliest Argon2 read: t=3 passes, p=4 lanes, 2^16 KiB (64 MiB), RFC 9580 §4.2.1's second
 * recommended choice and OpenPGP.js's default. The S2K specifier is covered by no signature, so a key
 * whose signatures all verify may still ask for hours of Argon2: it is refused before any is run.
 */
const MAX_ARGON2 = { t: 3, p: 4, encodedM: 16 } as const;
const SHA256 = 8;
const AES256 = 9;
const OCB = 2;

const CIPHERS: Record<number, { bits: number }> = { 7: { bits: 128 }, 8: { bits: 192 }, 9: { bits: 256 } };
const AEADS: Record<number, { mode: 'ocb' | 'gcm'; nonceBytes: number }> = { 2: { mode: 'ocb', nonceBytes: 15 }, 3: { mode: 'gcm', nonceBytes: 12 } };
/** S2K hashes read; each gives at least the 32 octets of an AES-256 key in one pass. */
const S2K_HASHES: Record<number, string> = { 8: 'sha256', 9: 'sha384', 10: 'sha512', 12: 'sha3-256', 14: 'sha3-512' };
const TAG_BYTES = 16;

/** The secret part of a v6 secret key packet (from the S2K usage octet on) locking `material` under `secret`. */
export function lockMaterial(tag: number, publicBody: Buffer, material: Buffer, secret: string, s2kCountByte: number): Buffer {
  const s2k = Buffer.concat([Buffer.from([S2K_ITERATED, SHA256]), crypto.randomBytes(8), Buffer.from([s2kCountByte])]);
  const key = aeadKey(tag, AES256, OCB, iterated('sha256', s2k.subarray(2, 10), s2kCountByte, secret));
  const nonce = crypto.randomBytes(AEADS[OCB].nonceBytes);
  const cipher = crypto.createCipheriv('aes-256-ocb', key, nonce, { authTagLength: TAG_BYTES });
  cipher.setAAD(associated(tag, publicBody));
  const sealed = Buffer.concat([cipher.update(material), cipher.final(), cipher.getAuthTag()]);
  const fields = Buffer.concat([Buffer.from([AES256, OCB, s2k.length]), s2k, nonce]);
  return Buffer.concat([Buffer.from([USAGE_AEAD, fields.length]), fields, sealed]);
}

/**
 * The material a secret part locks, or null when `secret` does not open it (the AEAD tag or the SHA-1
 * check fails). Throws through `fail` for a part that is malformed or locked in a way not read here,
 * through `tooCostly` for Argon2 beyond MAX_ARGON2.
 */
export function unlockMaterial(
  tag: number,
  publicBody: Buffer,
  secretPart: Buffer,
  secret: string,
  fail: (why: string) => Error,
  tooCostly: (why: string) => Error = fail,
): Buffer | null {
  const c = new Cursor(secretPart, fail);
  const usage = c.u8();
  if (usage === 0) return c.rest(); // v6: no checksum after unprotected material
  if (usage !== USAGE_AEAD && usage !== USAGE_CFB) throw fail(`S2K usage ${usage} (a v6 key uses 0, 253 or 254)`);
  const fields = new Cursor(c.bytes(c.u8()), fail);
  const symmetric = fields.u8();
  const cipher = CIPHERS[symmetric];
  if (!cipher) throw fail(`secret key cipher ${symmetric} (read here: AES)`);
  const aeadId = usage === USAGE_AEAD ? fields.u8() : 0;
  const aead = usage === USAGE_AEAD ? AEADS[aeadId] : undefined;
  if (usage === USAGE_AEAD && !aead) throw fail(`secret key AEAD mode ${aeadId} (read here: OCB, GCM)`);
  const derive = s2kOf(new Cursor(fields.bytes(fields.u8()), fail), cipher.bits / 8, fail, tooCostly);
  const iv = fields.bytes(aead ? aead.nonceBytes : 16);
  fields.end('secret key lock parameters');
  const derived = derive(secret);
  const body = c.rest();
  if (aead) {
    if (body.length < TAG_BYTES) throw fail('locked secret key material shorter than its tag');
    const name = `aes-${cipher.bits}-${aead.mode}` as crypto.CipherOCBTypes;
    const decipher = crypto.createDecipheriv(name, aeadKey(tag, symmetric, aeadId, derived, cipher.bits / 8), iv, { authTagLength: TAG_BYTES });
    decipher.setAAD(associated(tag, publicBody));
    decipher.setAuthTag(body.subarray(body.length - TAG_BYTES));
    try {
      return Buffer.concat([decipher.update(body.subarray(0, body.length - TAG_BYTES)), decipher.final()]);
    } catch {
      return null;
    }
  }
  const decipher = crypto.createDecipheriv(`aes-${cipher.bits}-cfb`, derived, iv);
  const plain = Buffer.concat([decipher.update(body), decipher.final()]);
  if (plain.length < 20) throw fail('locked secret key material shorter than its check');
  const material = plain.subarray(0, plain.length - 20);
  return crypto.timingSafeEqual(crypto.createHash('sha1').update(material).digest(), plain.subarray(plain.length - 20)) ? material : null;
}

/** The key derivation an S2K specifier names, checked whole (and its cost bounded) before any is run. */
function s2kOf(s2k: Cursor, keyBytes: number, fail: (why: string) => Error, tooCostly: (why: string) => Error): (secret: string) => Buffer {
  const type = s2k.u8();
  if (type === S2K_ITERATED) {
    const hash = S2K_HASHES[s2k.u8()];
    if (!hash) throw fail('an S2K hash not read here');
    const salt = s2k.bytes(8);
    const count = s2k.u8();
    s2k.end('S2K specifier');
    return (secret) => iterated(hash, salt, count, secret).subarray(0, keyBytes);
  }
  if (type !== S2K_ARGON2) throw fail(`S2K type ${type} (read here: 3, iterated and salted; 4, Argon2)`);
  // RFC 9580 §3.7.1.4: a 16-octet salt, passes t, parallelism p, memory 2^encodedM KiB; Argon2id, version 0x13.
  const salt = s2k.bytes(16);
  const [t, p, encodedM] = [s2k.u8(), s2k.u8(), s2k.u8()];
  s2k.end('S2K specifier');
  if (t < 1 || p < 1 || encodedM < 3 + Math.ceil(Math.log2(p)) || encodedM > 31) throw fail(`Argon2 parameters t=${t}, p=${p}, m=2^${encodedM} KiB`);
  if (t > MAX_ARGON2.t || p > MAX_ARGON2.p || encodedM > MAX_ARGON2.encodedM)
    throw tooCostly(`Argon2 t=${t}, p=${p}, m=2^${encodedM} KiB; at most t=${MAX_ARGON2.t}, p=${MAX_ARGON2.p}, m=2^${MAX_ARGON2.encodedM} KiB are accepted`);
  return (secret) =>
    crypto.argon2Sync('argon2id', { message: Buffer.from(secret, 'utf8'), nonce: salt, parallelism: p, tagLength: keyBytes, memory: 2 ** encodedM, passes: t });
}

/** Iterated and salted S2K (RFC 9580 §3.7.1.3): the hash of `count` octets of salt ‖ secret repeated (all of it once at least). */
function iterated(hash: string, salt: Buffer, c: number, secret: string): Buffer {
  const count = (16 + (c & 15)) << ((c >> 4) + 6);
  const salted = Buffer.concat([salt, Buffer.from(secret, 'utf8')]);
  const h = crypto.createHash(hash);
  for (let left = Math.max(count, salted.length); left > 0; left -= salted.length) h.update(salted.subarray(0, Math.min(left, salted.length)));
  return h.digest();
}

/** The AEAD key (RFC 9580 §5.5.3): HKDF-SHA256 of the S2K output, no salt, info = packet tag (OpenPGP form), version 6, cipher, AEAD mode. */
const aeadKey = (tag: number, cipher: number, aead: number, derived: Buffer, bytes = 32): Buffer =>
  Buffer.from(crypto.hkdfSync('sha256', derived, Buffer.alloc(0), Buffer.from([0xc0 | tag, 6, cipher, aead]), bytes));

/** The associated data: the packet tag in OpenPGP form, then the public key packet's body. */
const associated = (tag: number, publicBody: Buffer): Buffer => Buffer.concat([Buffer.from([0xc0 | tag]), publicBody]);
