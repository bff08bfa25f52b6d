import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';

/**
 * The key at the root of trust: it only wraps and unwraps the keyring's data keys (a few calls when a
 * process loads the keyring), never a stored value. A provider is anything that can do that without
 * handing out its key: MASTER_KEY (below) and a PKCS#11 token (./pkcs11-root.ts) are built; a cloud KMS
 * or Vault Transit would be a third implementation of this interface.
 */
export interface RootKey {
  /** Names the root in the keyring rows it wraps; no secret (`master-key:<kid>`, `pkcs11:token=…;object=…`). */
  readonly id: string;
  wrap(kid: string, key: Buffer): Promise<string>;
  /** Throws RootKeyError when the wrapped key does not open under this root (another root, or changed). */
  unwrap(kid: string, wrapped: string): Promise<Buffer>;
  close(): Promise<void>;
}

/** A start-up or CLI failure of the root of trust, said in one line that names the cause and never a secret. */
export class RootKeyError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'RootKeyError';
  }
}

const IV_BYTES = 12;
const TAG_BYTES = 16;
/** Binds a wrapped data key to its key id, so one row's material cannot be moved under another id. */
export const wrapAad = (kid: string) => Buffer.from(`kms/keyring/v1:${kid}`);

export const WRAPPED_PREFIX = 'w1.';

/** Parses `kid:base64(32 bytes)` (kid `k1` when absent), as MASTER_KEY and MASTER_KEYS_PREVIOUS hold it. */
export function parseKeySpec(spec: string): [string, Buffer] {
  const at = spec.indexOf(':');
  const kid = at > 0 ? spec.slice(0, at) : 'k1';
  const key = Buffer.from(at > 0 ? spec.slice(at + 1) : spec, 'base64');
  if (!/^[A-Za-z0-9_-]{1,32}$/.test(kid)) throw new Error('master key id must be 1-32 characters of [A-Za-z0-9_-]');
  if (key.length !== 32) throw new Error(`master key "${kid}" must be 32 bytes, base64 encoded`);
  return [kid, key];
}

/** A root key given as MASTER_KEY (or one of MASTER_KEYS_PREVIOUS): AES-256-GCM under a key derived from it. */
export function envRootKey(spec: string): RootKey {
  const [kid, material] = parseKeySpec(spec);
  const key = Buffer.from(hkdfSync('sha256', material, Buffer.alloc(0), 'kms/keyring-root/v1', 32));
  const id = `master-key:${kid}`;
  return {
    id,
    async wrap(dataKid, data) {
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv('aes-256-gcm', key, iv, { authTagLength: TAG_BYTES });
      cipher.setAAD(wrapAad(dataKid));
      return WRAPPED_PREFIX + Buffer.concat([iv, cipher.update(data), cipher.final(), cipher.getAuthTag()]).toString('base64url');
    },
    async unwrap(dataKid, wrapped) {
      const raw = Buffer.from(wrapped.slice(WRAPPED_PREFIX.length), 'base64url');
      try {
        if (!wrapped.startsWith(WRAPPED_PREFIX) || raw.length < IV_BYTES + TAG_BYTES) throw new Error('format');
        const decipher = createDecipheriv('aes-256-gcm', key, raw.subarray(0, IV_BYTES), { authTagLength: TAG_BYTES });
        decipher.setAAD(wrapAad(dataKid));
        decipher.setAuthTag(raw.subarray(raw.length - TAG_BYTES));
        return Buffer.concat([decipher.update(raw.subarray(IV_BYTES, raw.length - TAG_BYTES)), decipher.final()]);
      } catch {
        throw new RootKeyError(
          `the keyring's data key "${dataKid}" does not open with the root key ${id}: the MASTER_KEY given is not the one that wrapped it`,
        );
      }
    },
    async close() {},
  };
}
