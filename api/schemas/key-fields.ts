import { z } from 'zod';
import { Timestamp, text } from './common';

/** A v4 fingerprint: 40 hex digits; spaces are tolerated (as gpg prints them) and case is ignored. */
export const Fingerprint = z
  .string()
  .transform((s) => s.replace(/\s+/g, '').toLowerCase())
  .pipe(z.string().regex(/^[0-9a-f]{40}$/, 'a fingerprint is 40 hexadecimal digits'));

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

export const Algorithm = z.enum(['curve25519', 'rsa3072', 'rsa4096']);

export const Key = z
  .object({
    lineage_id: z.uuid().describe('The key across its generations (rotation history, shares, monitoring); paths and bodies name a key by fingerprint'),
    fingerprint: z.string(),
    label: z.string(),
    environment: z.string(),
    algorithm: z.string(),
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
