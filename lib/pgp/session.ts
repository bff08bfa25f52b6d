import * as openpgp from 'openpgp';

const { enums } = openpgp;

/**
 * Session keys of RSA (and ElGamal) PKESKs are decrypted in constant time: a PKCS#1 failure yields a
 * random key instead of an error, so whether the padding was valid is not revealed (Bleichenbacher).
 */
export const SESSION_KEY_CONFIG: openpgp.PartialConfig = { constantTimePKCS1Decryption: true };

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
export async function sessionKeyV1(message: openpgp.Message<unknown>, privateKey: openpgp.PrivateKey): Promise<openpgp.SessionKey> {
  const candidates = await openpgp.decryptSessionKeys({
    message: message as openpgp.Message<Uint8Array>,
    decryptionKeys: privateKey,
    config: SESSION_KEY_CONFIG,
  });
  const v1 = candidates.filter((k): k is openpgp.SessionKey => k.algorithm !== null); // v1 PKESKs name the cipher
  if (!v1.length) throw new Error('Session key decryption failed: no session key for SEIPDv1');
  if (v1.length === 1) return v1[0]!;
  let prefs: number[] = [];
  try {
    prefs = (await privateKey.getPrimaryUser()).selfCertification.preferredSymmetricAlgorithms ?? [];
  } catch {
    // no usable self-signature: the default order below
  }
  const order = [...prefs, enums.symmetric.aes256, enums.symmetric.aes128, enums.symmetric.aes192];
  const rank = (k: openpgp.SessionKey) => {
    const i = order.indexOf(enums.symmetric[k.algorithm]);
    return i < 0 ? order.length : i;
  };
  return v1.reduce((best, k) => (rank(k) < rank(best) ? k : best));
}
