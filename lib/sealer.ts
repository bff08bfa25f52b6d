import { createCipheriv, createDecipheriv, createHmac, hkdfSync, randomBytes, timingSafeEqual } from 'node:crypto';
import { AppError } from './errors';
import { parseKeySpec } from './root-of-trust/root-key';

/**
 * Envelope encryption of secrets at rest (and in Redis) under the keyring's data keys: AES-256-GCM with the
 * key id in the output, so the key can be rotated: new seals use the current key, old ones still open with
 * the keys not yet retired. Format: `s1.<kid>.<base64url(iv ‖ ciphertext ‖ tag)>`. The optional `aad` binds a
 * sealed value to its place (e.g. a row id) so it cannot be swapped into another.
 */
export interface Sealer {
  seal(plaintext: string | Buffer, aad?: string): string;
  open(sealed: string, aad?: string): Buffer;
  openText(sealed: string, aad?: string): string;
  /**
   * Authenticates public data that decides where things are encrypted (a row's public key, fingerprint):
   * HMAC-SHA256 under a key derived from the current data key, `m1.<kid>.<base64url>`, so a database
   * write alone cannot swap it. `verifyMac` accepts tags of any data key not retired.
   */
  mac(data: string): string;
  verifyMac(data: string, tag: string): boolean;
}

const IV_BYTES = 12;
const TAG_BYTES = 16;

/** The keys a sealer uses: the keyring (lib/root-of-trust/keyring.ts) in a service, a fixed set in tests. */
export interface SealingKeys {
  /** The key new seals and MACs use. */
  current(): { kid: string; key: Buffer };
  get(kid: string): Buffer | undefined;
  /** The key id was retired: what it sealed no longer opens here. */
  isRetired(kid: string): boolean;
}

/**
 * A value sealed (or a row MAC'd) under a key id this process has no key for: a retired data key, or
 * one it never had (a database from another installation). A 500 that names the key id, not a generic one.
 */
class SealingKeyError extends AppError {
  constructor(
    readonly kid: string,
    retired: boolean,
  ) {
    super(
      500,
      'master_key_unavailable',
      retired
        ? `A stored value is sealed under master key id "${kid}", which was retired.`
        : `A stored value is sealed under master key id "${kid}", which this service does not have.`,
    );
    this.name = 'SealingKeyError';
  }
}

/** A fixed set of keys from `kid:base64` specs: the first is current. */
function fixedKeys(current: string, previous: string[] = []): SealingKeys {
  const [currentKid, currentKey] = parseKeySpec(current);
  const keys = new Map([[currentKid, currentKey], ...previous.map(parseKeySpec)]);
  return { current: () => ({ kid: currentKid, key: currentKey }), get: (kid) => keys.get(kid), isRetired: () => false };
}

export const createSealer = (current: string, previous: string[] = []): Sealer => sealerOver(fixedKeys(current, previous));

export function sealerOver(keys: SealingKeys): Sealer {
  const keyOf = (kid: string) => {
    const key = keys.get(kid);
    if (!key) throw new SealingKeyError(kid, keys.isRetired(kid));
    return key;
  };

  const open = (sealed: string, aad = '') => {
    const parts = sealed.split('.');
    const [version, kid, body] = parts;
    if (parts.length !== 3 || version !== 's1' || !kid || !body) throw new Error('sealed value: unknown format or master key id');
    const key = keyOf(kid);
    // One spelling per value: Buffer.from would skip characters outside base64url instead of refusing them.
    if (!/^[A-Za-z0-9_-]+$/.test(body)) throw new Error('sealed value: the body is not base64url');
    const raw = Buffer.from(body, 'base64url');
    if (raw.length < IV_BYTES + TAG_BYTES) throw new Error('sealed value: too short to hold an IV and a full tag');
    // authTagLength pins the tag at 16 bytes: without it Node accepts a truncated tag.
    const decipher = createDecipheriv('aes-256-gcm', key, raw.subarray(0, IV_BYTES), { authTagLength: TAG_BYTES });
    decipher.setAAD(Buffer.from(aad));
    decipher.setAuthTag(raw.subarray(raw.length - TAG_BYTES));
    return Buffer.concat([decipher.update(raw.subarray(IV_BYTES, raw.length - TAG_BYTES)), decipher.final()]);
  };

  /** MAC keys by data key (a key object per kid: derived once, and data keys are never reused under another id). */
  const macKeys = new WeakMap<Buffer, Buffer>();
  const hmac = (key: Buffer, data: string) => {
    let macKey = macKeys.get(key);
    if (!macKey) macKeys.set(key, (macKey = Buffer.from(hkdfSync('sha256', key, Buffer.alloc(0), 'kms/row-mac/v1', 32))));
    return createHmac('sha256', macKey).update(data).digest();
  };

  return {
    mac(data) {
      const { kid, key } = keys.current();
      return `m1.${kid}.${hmac(key, data).toString('base64url')}`;
    },
    verifyMac(data, tag) {
      const [version, kid, body] = tag.split('.');
      if (version !== 'm1' || !kid || !body) return false;
      // A retired key id is named; an id never known is a changed row like any other.
      const key = keys.isRetired(kid) ? keyOf(kid) : keys.get(kid);
      if (!key) return false;
      const given = Buffer.from(body, 'base64url');
      const expected = hmac(key, data);
      return given.length === expected.length && timingSafeEqual(given, expected);
    },
    seal(plaintext, aad = '') {
      const { kid, key } = keys.current();
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv('aes-256-gcm', key, iv, { authTagLength: TAG_BYTES });
      cipher.setAAD(Buffer.from(aad));
      const ct = Buffer.concat([cipher.update(plaintext), cipher.final()]);
      return `s1.${kid}.${Buffer.concat([iv, ct, cipher.getAuthTag()]).toString('base64url')}`;
    },
    open,
    openText: (sealed, aad) => open(sealed, aad).toString('utf8'),
  };
}
