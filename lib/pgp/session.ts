import * as openpgp from 'openpgp';
import { invalid } from '../errors';
import { WILDCARD_KEY_ID, openSessionKeyPacket } from './pkesk';

const { enums } = openpgp;

/**
 * Session keys of RSA (and ElGamal) PKESKs are decrypted in constant time: a PKCS#1 failure yields a
 * random key instead of an error, so whether the padding was valid is not revealed (Bleichenbacher).
 */
const SESSION_KEY_CONFIG: openpgp.PartialConfig = { constantTimePKCS1Decryption: true };

/** Most session key packets one message may have our key open: each is a private-key operation. */
export const MAX_SESSION_KEY_TRIES = 16;

/** The session key packets `privateKey` would open: those naming one of its key ids, and anonymous ones. */
export function sessionKeyPacketsFor(
  message: openpgp.Message<openpgp.MaybeStream<Uint8Array | string>>,
  privateKey: openpgp.PrivateKey,
): openpgp.PublicKeyEncryptedSessionKeyPacket[] {
  const ours = new Set(privateKey.getKeys().map((k) => k.getKeyID().toHex()));
  const packets = message.packets.filterByTag(enums.packet.publicKeyEncryptedSessionKey) as unknown as (openpgp.PublicKeyEncryptedSessionKeyPacket & {
    publicKeyID: openpgp.KeyID;
  })[];
  return packets.filter((p) => p.publicKeyID.toHex() === WILDCARD_KEY_ID || ours.has(p.publicKeyID.toHex()));
}

/**
 * Refuses (422 malformed_message) a message with more than MAX_SESSION_KEY_TRIES session key packets
 * our key would open: those naming one of its key ids, and anonymous ones (tried with every key).
 * OpenPGP.js opens them all, RSA ones in JavaScript at tens of milliseconds each (three times over in
 * constant-time mode), so a message of a few hundred KiB repeating one packet would hold a worker for
 * minutes. Returns those packets.
 */
function checkSessionKeyPackets(
  message: openpgp.Message<openpgp.MaybeStream<Uint8Array | string>>,
  privateKey: openpgp.PrivateKey,
): openpgp.PublicKeyEncryptedSessionKeyPacket[] {
  const packets = sessionKeyPacketsFor(message, privateKey);
  if (packets.length > MAX_SESSION_KEY_TRIES) {
    throw invalid('malformed_message', `The message has ${packets.length} session key packets for this key (at most ${MAX_SESSION_KEY_TRIES} are tried).`);
  }
  return packets;
}

/**
 * The session key of a SEIPDv1 message (the only format whose cipher is named inside the PKESK alone).
 *
 * In constant-time mode OpenPGP.js returns one candidate per AES size for an RSA key (the real key, if
 * any, under its own algorithm; random keys under the others), and its own `decrypt` would run all of
 * them in parallel: with streamed input one in ~15 random candidates makes it never settle (measured
 * 20 of 300 honest messages). So one is chosen here, by the recipient key's preferences (AES-256 for ours
 * and what gpg, sq and OpenPGP.js then use), never by the data: acting on decrypted bytes to pick one
 * would be an oracle again. A message to an RSA key under another AES size fails its integrity check.
 */
export async function sessionKeyV1(
  message: openpgp.Message<openpgp.MaybeStream<Uint8Array | string>>,
  privateKey: openpgp.PrivateKey,
): Promise<openpgp.SessionKey> {
  const mine = checkSessionKeyPackets(message, privateKey);
  // The common case, one packet for our key and it a Curve25519 one, opens on Node's crypto (pkesk.ts).
  const opened = mine.length === 1 ? await openSessionKeyPacket(mine[0], privateKey) : undefined;
  if (opened?.algorithm) return { data: opened.data, algorithm: opened.algorithm };
  const order = await preferenceOrder(privateKey);
  const aes = order.find((a) => AES.has(a))!;
  const candidates = await openpgp.decryptSessionKeys({
    message: message,
    decryptionKeys: privateKey,
    // An RSA packet is opened under the one AES size that would be picked below: once, not once per size.
    config: { ...SESSION_KEY_CONFIG, constantTimePKCS1DecryptionSupportedSymmetricAlgorithms: new Set([aes]) },
  });
  const v1 = candidates.filter((k): k is openpgp.SessionKey => k.algorithm !== null); // v1 PKESKs name the cipher
  if (!v1.length) throw new Error('Session key decryption failed: no session key for SEIPDv1');
  if (v1.length === 1) return v1[0];
  const rank = (k: openpgp.SessionKey) => {
    const i = order.indexOf(enums.symmetric[k.algorithm]);
    return i < 0 ? order.length : i;
  };
  return v1.reduce((best, k) => (rank(k) < rank(best) ? k : best));
}

/**
 * The session key of a SEIPDv2 message whose cipher takes `keyBytes` octets (the SEIPD packet names the
 * cipher; v6 packets do not). One packet for our key, to an X25519 or Curve25519 subkey, opens on Node's
 * crypto (pkesk.ts); any other packet, and one that does not open there, goes to OpenPGP.js, in
 * constant-time mode for RSA. A key of another size is no key: the message is then not for this key.
 */
export async function sessionKeyV2(
  message: openpgp.Message<openpgp.MaybeStream<Uint8Array | string>>,
  privateKey: openpgp.PrivateKey,
  keyBytes: number,
): Promise<Uint8Array | undefined> {
  const mine = checkSessionKeyPackets(message, privateKey);
  const opened = mine.length === 1 ? await openSessionKeyPacket(mine[0], privateKey) : undefined;
  if (opened?.data.length === keyBytes) return opened.data;
  const keys = await openpgp.decryptSessionKeys({ message, decryptionKeys: privateKey, config: SESSION_KEY_CONFIG });
  return keys.find((k) => k.data.length === keyBytes)?.data;
}

const AES = new Set<number>([enums.symmetric.aes128, enums.symmetric.aes192, enums.symmetric.aes256]);

/** The key's cipher preferences, then AES-256, AES-128 and AES-192 (so an AES size always comes up). */
async function preferenceOrder(privateKey: openpgp.PrivateKey): Promise<number[]> {
  let prefs: number[] = [];
  try {
    prefs = (await privateKey.getPrimaryUser()).selfCertification.preferredSymmetricAlgorithms ?? [];
  } catch {
    // no usable self-signature: the default order
  }
  return [...prefs, enums.symmetric.aes256, enums.symmetric.aes128, enums.symmetric.aes192];
}
