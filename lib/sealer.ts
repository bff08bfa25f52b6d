import { createCipheriv, createDecipheriv, createHmac, hkdfSync, randomBytes, timingSafeEqual } from 'node:crypto';

/**
 * Envelope encryption of secrets at rest (and in Redis) under the master key: AES-256-GCM with the key id
 * in the output, so the master key can be rotated: new seals use the current key, old ones still open with
 * the previous keys. Format: `s1.<kid>.<base64url(iv ‖ ciphertext ‖ tag)>`. The optional `aad` binds a
 * sealed value to its place (e.g. a row id) so it cannot be swapped into another.
 */
export interface Sealer {
  seal(plaintext: string | Buffer, aad?: string): string;
  open(sealed: string, aad?: string): Buffer;
  openText(sealed: string, aad?: string): string;
  /**
   * Authenticates public data that decides where things are encrypted (a row's public key, fingerprint):
   * HMAC-SHA256 under a key derived from the current master key, `m1.<kid>.<base64url>`, so a database
   * write alone cannot swap it. `verifyMac` accepts tags of any configured master key.
   */
  mac(data: string): string;
  verifyMac(data: string, tag: string): boolean;
}

const IV_BYTES = 12;
const TAG_BYTES = 16;

function parseKey(spec: string): [string, Buffer] {
  const at = spec.indexOf(':');
  const kid = at > 0 ? spec.slice(0, at) : 'k1';
  const key = Buffer.from(at > 0 ? spec.slice(at + 1) : spec, 'base64');
  if (!/^[A-Za-z0-9_-]{1,32}$/.test(kid)) throw new Error('master key id must be 1-32 characters of [A-Za-z0-9_-]');
  if (key.length !== 32) throw new Error(`master key "${kid}" must be 32 bytes, base64 encoded`);
  return [kid, key];
}

export function createSealer(current: string, previous: string[] = []): Sealer {
  const [currentKid, currentKey] = parseKey(current);
  const keys = new Map([[currentKid, currentKey], ...previous.map(parseKey)]);

  const open = (sealed: string, aad = '') => {
    const parts = sealed.split('.');
    const [version, kid, body] = parts;
    const key = kid === undefined ? undefined : keys.get(kid);
    if (parts.length !== 3 || version !== 's1' || !key || !body) throw new Error('sealed value: unknown format or master key id');
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

  const macKeys = new Map([...keys].map(([kid, key]) => [kid, Buffer.from(hkdfSync('sha256', key, Buffer.alloc(0), 'kms/row-mac/v1', 32))]));
  const hmac = (kid: string, data: string) => createHmac('sha256', macKeys.get(kid)!).update(data).digest();

  return {
    mac: (data) => `m1.${currentKid}.${hmac(currentKid, data).toString('base64url')}`,
    verifyMac(data, tag) {
      const [version, kid, body] = tag.split('.');
      if (version !== 'm1' || !kid || !macKeys.has(kid) || !body) return false;
      const given = Buffer.from(body, 'base64url');
      const expected = hmac(kid, data);
      return given.length === expected.length && timingSafeEqual(given, expected);
    },
    seal(plaintext, aad = '') {
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv('aes-256-gcm', currentKey, iv, { authTagLength: TAG_BYTES });
      cipher.setAAD(Buffer.from(aad));
      const ct = Buffer.concat([cipher.update(plaintext), cipher.final()]);
      return `s1.${currentKid}.${Buffer.concat([iv, ct, cipher.getAuthTag()]).toString('base64url')}`;
    },
    open,
    openText: (sealed, aad) => open(sealed, aad).toString('utf8'),
  };
}
