import { z } from 'zod';
import type { UserRow } from '../../db/users';
import { Timestamp, text } from './common';

export const Username = z
  .string()
  .trim()
  .min(3)
  .max(64)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, 'letters, digits, dot, dash and underscore; starts with a letter or digit');

export const CompanyName = text(200).nullable();

export const User = z
  .object({
    user_id: z.uuid(),
    username: z.string(),
    email: z.string(),
    email_verified: z.boolean().describe('The owner proved this mailbox (a confirmed change or a password reset)'),
    company_name: z.string().nullable(),
    role: z.enum(['user', 'admin']),
    rotation_interval_days: z.number().int().nullable().describe('The account rotation policy in days (null: off); keys in `policy` mode follow it'),
    created_at: Timestamp,
    updated_at: Timestamp,
  })
  .meta({ id: 'User' });

export const userOut = (u: UserRow): z.infer<typeof User> => ({
  user_id: u.id,
  username: u.username,
  email: u.email,
  email_verified: u.email_verified_at !== null,
  company_name: u.company_name,
  role: u.role,
  rotation_interval_days: u.rotation_days,
  created_at: u.created_at.toISOString(),
  updated_at: u.updated_at.toISOString(),
});

export const Session = z
  .object({
    token: z.string(),
    token_type: z.literal('Bearer'),
    expires_at: Timestamp,
  })
  .meta({ id: 'Session' });

export const ApiKeyStatus = z
  .object({
    status: z.enum(['active', 'rotated', 'revoked', 'expired', 'none']),
    prefix: z.string().nullable(),
    created_at: Timestamp.nullable(),
    expires_at: Timestamp.nullable(),
    last_used_at: Timestamp.nullable(),
    days_remaining: z.number().int().nullable(),
  })
  .meta({ id: 'PartnerApiKeyStatus' });
