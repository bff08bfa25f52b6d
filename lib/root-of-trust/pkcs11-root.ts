import { randomBytes } from 'node:crypto';
import pkcs11js from 'pkcs11js';
import { RootKeyError, WRAPPED_PREFIX, wrapAad, type RootKey } from './root-key';
import { parsePkcs11Uri, pkcs11RootId, readPin, type Pkcs11Uri } from './pkcs11-uri';

/**
 * The root key as a non-extractable AES-256 secret key inside a PKCS#11 token (an HSM; SoftHSM2 in the
 * tests). The key never leaves the token: data keys are wrapped and unwrapped by AES-GCM inside it, with
 * the data key's id as AAD. A process talks to the token when it loads the keyring, not per operation.
 */

/** One loaded and initialised module per library path: C_Initialize is per process. */
const modules = new Map<string, pkcs11js.PKCS11>();

/** The CKR_… code a pkcs11js call failed with. */
export const pkcs11Code = (err: unknown) => (err instanceof Error ? err.message.split(':')[0].trim() : String(err));

function loadModule(path: string): pkcs11js.PKCS11 {
  let m = modules.get(path);
  if (m) return m;
  m = new pkcs11js.PKCS11();
  try {
    m.load(path);
  } catch (err) {
    throw new RootKeyError(`MASTER_KEY_URI: the module-path ${path} is not a PKCS#11 library that loads (${pkcs11Code(err)})`);
  }
  try {
    m.C_Initialize();
  } catch (err) {
    if (pkcs11Code(err) !== 'CKR_CRYPTOKI_ALREADY_INITIALIZED')
      throw new RootKeyError(`MASTER_KEY_URI: the PKCS#11 library ${path} did not initialise (${pkcs11Code(err)})`);
  }
  modules.set(path, m);
  return m;
}

export interface Session {
  m: pkcs11js.PKCS11;
  session: pkcs11js.Handle;
  uri: Pkcs11Uri;
  id: string;
}

/** A read-write session on the token the URI names, logged in (once per process: the login holds for every session). */
export function openSession(uri: Pkcs11Uri): Session {
  const m = loadModule(uri.modulePath);
  const id = pkcs11RootId(uri);
  const slot = m.C_GetSlotList(true).find((s) => m.C_GetTokenInfo(s).label.trim() === uri.token);
  if (!slot) throw new RootKeyError(`MASTER_KEY_URI: no token labelled "${uri.token}" in ${uri.modulePath}`);
  const pin = readPin(uri);
  const session = m.C_OpenSession(slot, pkcs11js.CKF_SERIAL_SESSION | pkcs11js.CKF_RW_SESSION);
  try {
    m.C_Login(session, pkcs11js.CKU_USER, pin);
  } catch (err) {
    const code = pkcs11Code(err);
    if (code !== 'CKR_USER_ALREADY_LOGGED_IN') {
      m.C_CloseSession(session);
      const why = code === 'CKR_PIN_INCORRECT' ? 'the PIN is wrong' : code === 'CKR_PIN_LOCKED' ? 'the PIN is locked' : code;
      throw new RootKeyError(`MASTER_KEY_URI: logging in to token "${uri.token}" failed: ${why}`);
    }
  }
  return { m, session, uri, id };
}

/** The token's secret key labelled `label`, or null; more than one by that label is refused (which would it be?). */
export function findSecretKey({ m, session, uri }: Session, label: string): pkcs11js.Handle | null {
  m.C_FindObjectsInit(session, [
    { type: pkcs11js.CKA_CLASS, value: pkcs11js.CKO_SECRET_KEY },
    { type: pkcs11js.CKA_LABEL, value: label },
  ]);
  try {
    const found = m.C_FindObjects(session, 2);
    if (found.length > 1) throw new RootKeyError(`MASTER_KEY_URI: token "${uri.token}" holds more than one secret key labelled "${label}"`);
    return found[0] ?? null;
  } finally {
    m.C_FindObjectsFinal(session);
  }
}

const findKey = (s: Session) => findSecretKey(s, s.uri.object);

/**
 * Makes an AES-256 secret key labelled `label` in the token: on the token, private, sensitive, never
 * extractable, usable only to encrypt and decrypt (AES-GCM inside the token). Answers its handle.
 */
export function generateSecretKey({ m, session }: Session, label: string): pkcs11js.Handle {
  return m.C_GenerateKey(session, { mechanism: pkcs11js.CKM_AES_KEY_GEN }, [
    { type: pkcs11js.CKA_CLASS, value: pkcs11js.CKO_SECRET_KEY },
    { type: pkcs11js.CKA_KEY_TYPE, value: pkcs11js.CKK_AES },
    { type: pkcs11js.CKA_VALUE_LEN, value: 32 },
    { type: pkcs11js.CKA_LABEL, value: label },
    { type: pkcs11js.CKA_TOKEN, value: true },
    { type: pkcs11js.CKA_PRIVATE, value: true },
    { type: pkcs11js.CKA_SENSITIVE, value: true },
    { type: pkcs11js.CKA_EXTRACTABLE, value: false },
    { type: pkcs11js.CKA_ENCRYPT, value: true },
    { type: pkcs11js.CKA_DECRYPT, value: true },
    { type: pkcs11js.CKA_WRAP, value: false },
    { type: pkcs11js.CKA_UNWRAP, value: false },
    { type: pkcs11js.CKA_SIGN, value: false },
    { type: pkcs11js.CKA_VERIFY, value: false },
    { type: pkcs11js.CKA_DERIVE, value: false },
  ]);
}

/** AES-GCM inside the token: 96-bit IV, 128-bit tag, `aad` bound. */
export const tokenGcm = (iv: Buffer, aad: Buffer) => ({
  mechanism: pkcs11js.CKM_AES_GCM,
  parameter: { type: pkcs11js.CK_PARAMS_AES_GCM, iv, aad, ivBits: 96, tagBits: 128 },
});

const gcm = (iv: Buffer, kid: string) => tokenGcm(iv, wrapAad(kid));

/** Opens the root key MASTER_KEY_URI names; fails with one line when the token, the object or the PIN is wrong. */
export function openPkcs11Root(uriText: string): RootKey {
  const uri = parsePkcs11Uri(uriText);
  const s = openSession(uri);
  const { m, session, id } = s;
  try {
    const key = findKey(s);
    if (!key)
      throw new RootKeyError(`MASTER_KEY_URI: token "${uri.token}" has no secret key labelled "${uri.object}" (npm run admin -- master-key init creates it)`);
    const [extractable] = m.C_GetAttributeValue(session, key, [{ type: pkcs11js.CKA_EXTRACTABLE }]);
    if (!Buffer.isBuffer(extractable?.value) || extractable.value[0] !== 0)
      throw new RootKeyError(`MASTER_KEY_URI: the key "${uri.object}" in token "${uri.token}" is extractable; a root key must not be`);
    return {
      id,
      async wrap(kid, data) {
        const iv = randomBytes(12);
        m.C_EncryptInit(session, gcm(iv, kid), key);
        const out = m.C_Encrypt(session, data, Buffer.alloc(data.length + 16));
        return WRAPPED_PREFIX + Buffer.concat([iv, out]).toString('base64url');
      },
      async unwrap(kid, wrapped) {
        const raw = Buffer.from(wrapped.slice(WRAPPED_PREFIX.length), 'base64url');
        try {
          if (!wrapped.startsWith(WRAPPED_PREFIX) || raw.length < 12 + 16) throw new Error('format');
          m.C_DecryptInit(session, gcm(raw.subarray(0, 12), kid), key);
          return Buffer.from(m.C_Decrypt(session, raw.subarray(12), Buffer.alloc(raw.length)));
        } catch {
          throw new RootKeyError(`the keyring's data key "${kid}" does not open with the root key ${id}: the token's key is not the one that wrapped it`);
        }
      },
      async close() {
        m.C_CloseSession(session);
      },
    };
  } catch (err) {
    m.C_CloseSession(session);
    throw err;
  }
}

/** Creates the root key in the token when it has none by that label (generateSecretKey); answers whether it made one. */
export function initPkcs11Root(uriText: string): 'created' | 'exists' {
  const uri = parsePkcs11Uri(uriText);
  const s = openSession(uri);
  try {
    if (findKey(s)) return 'exists';
    generateSecretKey(s, uri.object);
    return 'created';
  } finally {
    s.m.C_CloseSession(s.session);
  }
}
