import { randomBytes } from 'node:crypto';
import type pkcs11js from 'pkcs11js';
import { AppError, gone, unavailable } from '../errors';
import { RootKeyError } from './root-key';
import { parsePkcs11Uri } from './pkcs11-uri';
import { findSecretKey, generateSecretKey, openSession, pkcs11Code, tokenGcm, type Session } from './pkcs11-root';

/**
 * Per-lineage keys in the token (LINEAGE_TOKEN_KEYS): a lineage made with the setting on has its own
 * AES-256 key in the token that holds the root key (MASTER_KEY_URI), labelled `kms-lineage-<lineage id>`,
 * sensitive and never extractable. Each of its generations' private keys is sealed under it inside the
 * token (AES-GCM, AAD binding lineage and generation), and the result is sealed by the keyring as every
 * stored value is: keyring rotation and re-seal move the outer layer and never call the token. Once the
 * lineage's last generation is destroyed the object is deleted, and every copy of those private keys
 * (database backups included) stays shut, whoever holds the root key.
 */
export interface LineageKeys {
  /** Makes the lineage's key unless the token holds it already (a retried job finds the one it made). */
  ensure(lineageId: string): Promise<void>;
  seal(lineageId: string, generation: number, plaintext: string): Promise<string>;
  open(lineageId: string, generation: number, sealed: string): Promise<string>;
  /** Deletes the lineage's key: 'absent' when the token holds none (deleted before). */
  remove(lineageId: string): Promise<'deleted' | 'absent'>;
  close(): Promise<void>;
}

export const lineageKeyLabel = (lineageId: string) => `kms-lineage-${lineageId}`;
const lineageKeyAad = (lineageId: string, generation: number) => Buffer.from(`kms/lineage-key/v1:${lineageId}:${generation}`);

/** What the token layer looks like inside the keyring's seal: `t1.<base64url(iv ‖ ciphertext ‖ tag)>`. */
const PREFIX = 't1.';
/** An armored private key starts `-----BEGIN`: the two never meet. */
export const isLineageSealed = (inner: string) => inner.startsWith(PREFIX);

const IV_BYTES = 12;
const TAG_BYTES = 16;
/** A cached handle another process's deletion (or a token reset) made stale: looked up again once. */
const STALE = new Set(['CKR_KEY_HANDLE_INVALID', 'CKR_OBJECT_HANDLE_INVALID']);

const missing = (lineageId: string) =>
  gone(
    'lineage_key_missing',
    `The token holds no key for lineage ${lineageId} (${lineageKeyLabel(lineageId)}): the private keys of this lineage cannot be opened.`,
  );

/** A token that fails or refuses: 503 naming the lineage and the token's answer (never a PIN: RootKeyError messages carry none). */
const refused = (lineageId: string, what: string, err: unknown) =>
  err instanceof AppError
    ? err
    : unavailable(
        'lineage_key_unavailable',
        `The token could not ${what} the key of lineage ${lineageId}: ${err instanceof RootKeyError ? err.message : pkcs11Code(err)}.`,
      );

/** CKS_RW_USER_FUNCTIONS (PKCS#11 §5.7): a read-write session of the logged-in user. */
const RW_USER = 3;
const loggedIn = ({ m, session }: Session) => {
  try {
    return m.C_GetSessionInfo(session).state === RW_USER;
  } catch {
    return false;
  }
};
const closeQuietly = ({ m, session }: Session) => {
  try {
    m.C_CloseSession(session);
  } catch {
    // A session the token closed already.
  }
};

/** The lineage keys in the token MASTER_KEY_URI names; its session opens on first use. */
export function tokenLineageKeys(uriText: string): LineageKeys {
  let opened: Session | undefined;
  const handles = new Map<string, pkcs11js.Handle>();
  /**
   * The session, logged in: one the token logged out (or closed) is opened and logged in again, so that a
   * search never answers "no such key" for a key it was not allowed to see.
   */
  const session = () => {
    if (opened && !loggedIn(opened)) {
      handles.clear();
      closeQuietly(opened);
      opened = undefined;
    }
    return (opened ??= openSession(parsePkcs11Uri(uriText)));
  };
  const find = (lineageId: string, fresh = false) => {
    const known = fresh ? undefined : handles.get(lineageId);
    if (known) return known;
    const found = findSecretKey(session(), lineageKeyLabel(lineageId));
    if (found) handles.set(lineageId, found);
    else handles.delete(lineageId);
    return found;
  };
  /** Runs `use` with the lineage's key; a stale cached handle is looked up again once. */
  const withKey = <T>(lineageId: string, what: string, use: (s: Session, key: pkcs11js.Handle) => T): T => {
    try {
      for (let fresh = false; ; fresh = true) {
        const key = find(lineageId, fresh);
        if (!key) throw missing(lineageId);
        try {
          return use(session(), key);
        } catch (err) {
          if (fresh || !STALE.has(pkcs11Code(err))) throw err;
        }
      }
    } catch (err) {
      throw refused(lineageId, what, err);
    }
  };
  return {
    async ensure(lineageId) {
      try {
        if (!find(lineageId)) handles.set(lineageId, generateSecretKey(session(), lineageKeyLabel(lineageId)));
      } catch (err) {
        throw refused(lineageId, 'create', err);
      }
    },
    async seal(lineageId, generation, plaintext) {
      return withKey(lineageId, 'use', ({ m, session: h }, key) => {
        const data = Buffer.from(plaintext, 'utf8');
        const iv = randomBytes(IV_BYTES);
        m.C_EncryptInit(h, tokenGcm(iv, lineageKeyAad(lineageId, generation)), key);
        const out = m.C_Encrypt(h, data, Buffer.alloc(data.length + TAG_BYTES));
        return PREFIX + Buffer.concat([iv, out]).toString('base64url');
      });
    },
    async open(lineageId, generation, sealed) {
      const raw = Buffer.from(sealed.slice(PREFIX.length), 'base64url');
      return withKey(lineageId, 'use', ({ m, session: h }, key) => {
        try {
          if (!isLineageSealed(sealed) || raw.length < IV_BYTES + TAG_BYTES) throw new Error('format');
          m.C_DecryptInit(h, tokenGcm(raw.subarray(0, IV_BYTES), lineageKeyAad(lineageId, generation)), key);
          return Buffer.from(m.C_Decrypt(h, raw.subarray(IV_BYTES), Buffer.alloc(raw.length))).toString('utf8');
        } catch (err) {
          if (STALE.has(pkcs11Code(err))) throw err;
          throw gone(
            'lineage_key_mismatch',
            `The token's key for lineage ${lineageId} does not open generation ${generation}'s private key: it is not the key that sealed it.`,
          );
        }
      });
    },
    async remove(lineageId) {
      try {
        const key = find(lineageId, true);
        if (!key) return 'absent';
        session().m.C_DestroyObject(session().session, key);
        handles.delete(lineageId);
        return 'deleted';
      } catch (err) {
        throw refused(lineageId, 'delete', err);
      }
    },
    async close() {
      handles.clear();
      if (opened) closeQuietly(opened);
      opened = undefined;
    },
  };
}

/** Without a token (no MASTER_KEY_URI), a lineage whose private keys carry the token layer cannot be opened: said, with its id. */
const noToken = (lineageId: string) =>
  Promise.reject(
    unavailable(
      'lineage_key_unavailable',
      `The private keys of lineage ${lineageId} are sealed under its key in the PKCS#11 token, and MASTER_KEY_URI is not set.`,
    ),
  );

export function lineageKeysOf(settings: { uri?: string }): LineageKeys {
  if (settings.uri) return tokenLineageKeys(settings.uri);
  return { ensure: noToken, seal: noToken, open: noToken, remove: noToken, close: async () => {} };
}
