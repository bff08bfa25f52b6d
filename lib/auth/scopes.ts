/**
 * What a managed API key (`kms_sk_…`) may do. Every route that an API key can reach (access 'auth')
 * names exactly one scope; a managed key holding it passes, one without it gets 403
 * `insufficient_scope`. Sessions and partner keys hold every scope. Routes that manage credentials,
 * billing, passkeys or the account itself are access 'session' and never take an API key.
 */
export const SCOPES = [
  'keys:read',
  'keys:write',
  'crypto:encrypt',
  'crypto:decrypt',
  'crypto:sign',
  'crypto:verify',
  'jobs:read',
  'shares:read',
  'shares:write',
  'audit:read',
  'events:read',
  'webhooks:write',
  'account:read',
] as const;

export type Scope = (typeof SCOPES)[number];

export const SCOPE_DESCRIPTIONS: Record<Scope, string> = {
  'keys:read': 'list keys, read public keys and rotation history',
  'keys:write': 'generate, disable and rotate keys, set rotation schedules and the account rotation policy',
  'crypto:encrypt': 'submit encryption jobs',
  'crypto:decrypt': 'submit decryption jobs (the key passphrase is still needed)',
  'crypto:sign': 'submit signing jobs (the key passphrase is still needed)',
  'crypto:verify': 'submit signature verification jobs',
  'jobs:read': 'read jobs and download their outputs (encrypt and decrypt clients need it to fetch results)',
  'shares:read': 'list public key shares and their analytics',
  'shares:write': 'create and revoke public key shares',
  'audit:read': 'read the audit log and recent activity',
  'events:read': 'follow account events (SSE) and read their history',
  'webhooks:write': 'manage webhook endpoints and their deliveries',
  'account:read': 'read the profile (GET /auth/me) and the partner key status',
};
