import { z } from 'zod';
import { Timestamp, text } from './common';
import { FINGERPRINT, KEY_PROFILES, PROFILE_ALGORITHMS } from '../../lib/pgp/profiles';

const KEY_ALGORITHMS = [...new Set(Object.values(PROFILE_ALGORITHMS).flat())] as [string, ...string[]];

/** A fingerprint: 40 hex digits (v4 key) or 64 (v6 key); spaces are tolerated (as gpg prints them) and case is ignored. */
export const Fingerprint = z
  .string()
  .transform((s) => s.replace(/\s+/g, '').toLowerCase())
  .pipe(z.string().regex(FINGERPRINT, 'a fingerprint is 40 hexadecimal digits (a v4 key) or 64 (a v6 key)'));

export const Environment = z
  .string()
  .trim()
  .toLowerCase()
  .regex(/^[a-z0-9][a-z0-9_-]{0,31}$/, '1-32 of a-z, 0-9, _ and -');

export const Label = text(100);

/** Passphrases protect private keys: at least 12 characters, spaces allowed. */
export const Passphrase = z.string().min(12, 'must be at least 12 characters').max(1024);

/** Form fields arrive as strings: "true"/"false" (also 1/0, yes/no, on/off). */
export const FormBoolean = z
  .union([z.boolean(), z.enum(['true', 'false', '1', '0', 'yes', 'no', 'on', 'off'])])
  .transform((v) => v === true || v === 'true' || v === '1' || v === 'yes' || v === 'on');

export const Algorithm = z.enum(KEY_ALGORITHMS);

export const Profile = z
  .enum(KEY_PROFILES)
  .describe(
    'rfc4880: v4 keys, files SEIPDv1 (every OpenPGP implementation, gpg 2.2 included); rfc9580: v6 Ed25519/X25519 keys, files SEIPDv2 (AEAD); pqc: v6 post-quantum keys (ML-DSA-65+Ed25519, ML-KEM-768+X25519, RFC 9980)',
  );

export const Key = z
  .object({
    lineage_id: z.uuid().describe('The key across its generations (rotation history, shares, monitoring); paths and bodies name a key by fingerprint'),
    fingerprint: z.string(),
    label: z.string(),
    environment: z.string(),
    algorithm: z.string(),
    profile: Profile.describe('The OpenPGP profile of the current generation'),
    rotation_profile: Profile.describe('The profile the next generation is made with (POST /keys/{fingerprint}/rotate and rotation-schedule change it)'),
    kind: z
      .enum(['managed', 'recipient'])
      .describe(
        'managed: holds its private key (generated or imported); recipient: an imported public key that encrypts and verifies, never decrypts or signs',
      ),
    imported: z.boolean().describe('The current generation was imported (POST /keys/import), not generated here'),
    uid: z.string().describe('The OpenPGP user id of the key, "Name <email>" (not an account id)'),
    status: z.enum(['active', 'disabled', 'expired']),
    active: z.boolean(),
    generation: z.number().int(),
    created_at: Timestamp,
    key_created_at: Timestamp,
    expires_at: Timestamp.nullable(),
    disabled_at: Timestamp.nullable(),
    rotation_mode: z.enum(['policy', 'interval', 'off']).describe("policy: follows the account's rotation_interval_days"),
    rotation_interval_days: z.number().int().nullable(),
    inherited: z
      .boolean()
      .optional()
      .describe("In key lists: true for a teammate's key inherited through team access (encrypt, share, public key; decrypt with its passphrase)"),
    owner: z
      .object({ user_id: z.uuid(), username: z.string() })
      .nullable()
      .optional()
      .describe('In key lists: the owning account of an inherited key (null for your own)'),
  })
  .meta({ id: 'Key' });
