import type { components } from './openapi.js';

/** What a managed API key may do: the `scopes` of POST /api-keys. */
export type Scope = components['schemas']['ManagedApiKey']['scopes'][number];

/** Every scope, in the order the service lists them (for choices in a CLI or a form). */
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
] as const satisfies readonly Scope[];

// Compiles only while SCOPES names every scope of the OpenAPI document (client/openapi.ts, regenerated).
const complete: [Exclude<Scope, (typeof SCOPES)[number]>] extends [never] ? true : false = true;
void complete;
