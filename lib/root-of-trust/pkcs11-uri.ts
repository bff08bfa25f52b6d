import { readFileSync } from 'node:fs';
import { RootKeyError } from './root-key';

/** What MASTER_KEY_URI names: an RFC 7512 PKCS#11 URI reduced to the attributes the root key uses. */
export interface Pkcs11Uri {
  token: string;
  object: string;
  modulePath: string;
  /** Where the user PIN is read from (`pin-source=file:…`), or the PIN itself (`pin-value=…`). */
  pin: { file: string } | { value: string };
}

const decode = (v: string, name: string) => {
  try {
    return decodeURIComponent(v);
  } catch {
    throw new RootKeyError(`MASTER_KEY_URI: the ${name} attribute is not percent-encoded correctly`);
  }
};

function attributes(part: string, separator: string, what: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const item of part.split(separator).filter(Boolean)) {
    const eq = item.indexOf('=');
    if (eq <= 0) throw new RootKeyError(`MASTER_KEY_URI: "${item.split('=')[0]}" in the ${what} has no value`);
    const name = item.slice(0, eq);
    if (out.has(name)) throw new RootKeyError(`MASTER_KEY_URI: the ${what} names "${name}" twice`);
    out.set(name, decode(item.slice(eq + 1), name));
  }
  return out;
}

/**
 * `pkcs11:token=kms;object=kms-root?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/kms/pin`.
 * Path attributes are `;`-separated, query attributes `&`-separated (RFC 7512 §2.3); other attributes
 * (serial, id, manufacturer …) are refused rather than ignored, so a URI never selects less than it says.
 */
export function parsePkcs11Uri(uri: string): Pkcs11Uri {
  if (!uri.startsWith('pkcs11:')) throw new RootKeyError('MASTER_KEY_URI must be a PKCS#11 URI (pkcs11:token=…;object=…?module-path=…&pin-source=file:…)');
  const [path = '', query = ''] = uri.slice('pkcs11:'.length).split('?', 2);
  const p = attributes(path, ';', 'path');
  const q = attributes(query, '&', 'query');
  for (const name of p.keys())
    if (name !== 'token' && name !== 'object' && name !== 'type')
      throw new RootKeyError(`MASTER_KEY_URI: the path attribute "${name}" is not supported (token, object, type=secret-key)`);
  for (const name of q.keys())
    if (!['module-path', 'pin-source', 'pin-value'].includes(name))
      throw new RootKeyError(`MASTER_KEY_URI: the query attribute "${name}" is not supported (module-path, pin-source, pin-value)`);
  if (p.has('type') && p.get('type') !== 'secret-key') throw new RootKeyError('MASTER_KEY_URI: the root key is a secret key (type=secret-key)');
  const token = p.get('token');
  const object = p.get('object');
  const modulePath = q.get('module-path');
  if (!token || !object || !modulePath) throw new RootKeyError('MASTER_KEY_URI must name the token, the object and the module-path');
  const source = q.get('pin-source');
  const value = q.get('pin-value');
  if ((source === undefined) === (value === undefined))
    throw new RootKeyError('MASTER_KEY_URI must give the PIN by exactly one of pin-source=file:… and pin-value=…');
  if (source !== undefined && !source.startsWith('file:')) throw new RootKeyError('MASTER_KEY_URI: pin-source must be a file: URI');
  const pin = source !== undefined ? { file: source.replace(/^file:(\/\/(?=\/))?/, '') } : { value: value! };
  return { token, object, modulePath, pin };
}

/** The URI without its PIN, for messages and the keyring's root ids. */
export const pkcs11RootId = (u: Pkcs11Uri) => `pkcs11:token=${encodeURIComponent(u.token)};object=${encodeURIComponent(u.object)}`;

export function readPin(u: Pkcs11Uri): string {
  if ('value' in u.pin) return u.pin.value;
  try {
    return readFileSync(u.pin.file, 'utf8').replace(/\r?\n$/, '');
  } catch (err) {
    throw new RootKeyError(`MASTER_KEY_URI: the PIN file ${u.pin.file} cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
  }
}
