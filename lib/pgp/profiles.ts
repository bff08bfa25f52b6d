/**
 * OpenPGP profiles: which format a generated key takes, and so what is written to it (docs/openpgp-profiles.md).
 * - `rfc4880`: v4 keys that say "MDC only"; files to them are SEIPDv1 (AES-256-CFB + SHA-1 MDC), which
 *   every OpenPGP implementation reads, gpg 2.2 and Sequoia 0.27 included. The default.
 * - `rfc9580`: v6 keys (Ed25519 primary, X25519 subkey) whose features say SEIPDv2: files to them are
 *   AEAD (AES-256 in OCB or GCM chunks), read by OpenPGP.js 6, Sequoia 2, Bouncy Castle (not by GnuPG, which follows LibrePGP).
 * - `pqc`: v6 keys with a post-quantum composite primary (ML-DSA-65+Ed25519) and subkey
 *   (ML-KEM-768+X25519), RFC 9980: files to them stay secret against a later quantum computer.
 */
export const KEY_PROFILES = ['rfc4880', 'rfc9580', 'pqc'] as const;
export type KeyProfile = (typeof KEY_PROFILES)[number];

/** The algorithm a generated key of each profile has, named as the API names it; `rfc4880` also makes RSA. */
export const PROFILE_ALGORITHMS = {
  rfc4880: ['curve25519', 'rsa3072', 'rsa4096'],
  rfc9580: ['curve25519'],
  pqc: ['ml-kem-768+x25519'],
} as const satisfies Record<KeyProfile, readonly string[]>;

export type KeyAlgorithm = (typeof PROFILE_ALGORITHMS)[KeyProfile][number];

/** The algorithm a key of `profile` is made with when the caller names none. */
export const defaultAlgorithm = (profile: KeyProfile): KeyAlgorithm => PROFILE_ALGORITHMS[profile][0];

export const profileAllows = (profile: KeyProfile, algorithm: string): boolean => (PROFILE_ALGORITHMS[profile] as readonly string[]).includes(algorithm);

/** A fingerprint as stored: lowercase hex, 40 digits for a v4 key (SHA-1), 64 for a v6 key (SHA-256). */
export const FINGERPRINT = /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/;
