import { randomBytes, timingSafeEqual } from 'node:crypto';
import { crc32 } from 'node:zlib';

/**
 * Managed API keys: `kms_sk_` + 256 random bits (43 base62 characters) + a 6-character base62 CRC32 of
 * everything before it, as GitHub's tokens carry. The checksum lets the service (and secret scanners)
 * tell a mistyped or made-up key from a real one without any lookup: a value whose checksum does not
 * match is refused before the database is asked. The checksum is no secret and adds no security; the
 * 256 random bits do. Base62 keeps the value one "word" (double-click selects it; no URL escaping).
 */
export const MANAGED_KEY_PREFIX = 'kms_sk_';

const ALPHABET = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
/** 62^43 > 2^256, so 43 digits hold any 32-byte number. */
const BODY_CHARS = 43;
/** 62^6 > 2^32. */
const CHECKSUM_CHARS = 6;
/** Characters of a value shown in lists: the kind and the first 6 random characters (~36 bits, useless to a guesser). */
const DISPLAY_CHARS = MANAGED_KEY_PREFIX.length + 6;

const SHAPE = new RegExp(`^${MANAGED_KEY_PREFIX}[0-9A-Za-z]{${BODY_CHARS + CHECKSUM_CHARS}}$`);

function base62(n: bigint, width: number): string {
  let out = '';
  for (let v = n; v > 0n; v /= 62n) out = ALPHABET[Number(v % 62n)] + out;
  return out.padStart(width, '0');
}

const checksum = (head: string) => base62(BigInt(crc32(head)), CHECKSUM_CHARS);

/** A fresh managed key value. */
export function newManagedKey(): string {
  const head = MANAGED_KEY_PREFIX + base62(BigInt('0x' + randomBytes(32).toString('hex')), BODY_CHARS);
  return head + checksum(head);
}

/** What the service may show of a value (lists, audit rows, logs). */
export const displayPrefix = (value: string) => value.slice(0, DISPLAY_CHARS);

/**
 * Whether `value` is shaped like a managed key and its checksum matches: pure computation, no I/O.
 * `malformed`: wrong length or characters; `bad_checksum`: the right shape, but mistyped or invented.
 */
export function checkManagedKey(value: string): 'ok' | 'malformed' | 'bad_checksum' {
  if (!SHAPE.test(value)) return 'malformed';
  const head = value.slice(0, -CHECKSUM_CHARS);
  const expected = Buffer.from(checksum(head));
  return timingSafeEqual(expected, Buffer.from(value.slice(-CHECKSUM_CHARS))) ? 'ok' : 'bad_checksum';
}
