import { z } from 'zod';
import { route } from '../../route';
import { PageQuery, Timestamp, iso, isoOrNull, pageOf, text } from '../../schemas/common';
import { Session, User, userOut } from '../../schemas/account-fields';
import * as passkeys from '../../../lib/accounts/passkeys';
import type { PasskeyRow } from '../../../db/passkeys';

const tags = ['Passkeys'];

/** base64url without padding, as WebAuthn's JSON encodings send it (credential ids are compared as text). */
const B64u = (max: number) =>
  z
    .string()
    .min(1)
    .max(max)
    .regex(/^[A-Za-z0-9_-]+$/, 'must be base64url (no padding)');
const ChallengeId = z
  .string()
  .regex(/^[A-Za-z0-9_-]{43}$/, 'the challenge_id from begin')
  .describe('The `challenge_id` the begin call answered; single use');
const TRANSPORTS = ['ble', 'cable', 'hybrid', 'internal', 'nfc', 'smart-card', 'usb'] as const;
type Transport = (typeof TRANSPORTS)[number];
/** Transports a browser reports; names this library does not know yet are dropped, not refused. */
const Transports = z
  .array(z.string().max(32))
  .max(16)
  .transform((ts) => ts.filter((t): t is Transport => (TRANSPORTS as readonly string[]).includes(t)));
const ExtensionResults = z.record(z.string(), z.unknown()).default({});
const Attachment = z.enum(['platform', 'cross-platform']).optional();

const RegistrationCredential = z
  .object({
    id: B64u(1400),
    rawId: B64u(1400),
    type: z.literal('public-key'),
    response: z.object({
      clientDataJSON: B64u(16_384),
      attestationObject: B64u(65_536),
      transports: Transports.optional(),
    }),
    authenticatorAttachment: Attachment,
    clientExtensionResults: ExtensionResults,
  })
  .describe("What @simplewebauthn/browser's startRegistration() answers (RegistrationResponseJSON)")
  .meta({ id: 'PasskeyRegistrationCredential' });

const AuthenticationCredential = z
  .object({
    id: B64u(1400),
    rawId: B64u(1400),
    type: z.literal('public-key'),
    response: z.object({
      clientDataJSON: B64u(16_384),
      authenticatorData: B64u(16_384),
      signature: B64u(2048),
      userHandle: B64u(128).optional(),
    }),
    authenticatorAttachment: Attachment,
    clientExtensionResults: ExtensionResults,
  })
  .describe("What @simplewebauthn/browser's startAuthentication() answers (AuthenticationResponseJSON)")
  .meta({ id: 'PasskeyAuthenticationCredential' });

const CredentialDescriptor = z.object({ id: z.string(), type: z.literal('public-key'), transports: z.array(z.string()).optional() });

/** Loose objects: the options go to the browser as the library made them, fields added later included. */
const CreationOptions = z
  .looseObject({
    challenge: z.string(),
    rp: z.object({ id: z.string().optional(), name: z.string() }),
    user: z.object({ id: z.string(), name: z.string(), displayName: z.string() }),
    pubKeyCredParams: z.array(z.object({ alg: z.number().int(), type: z.literal('public-key') })),
    timeout: z.number().int().optional(),
    excludeCredentials: z.array(CredentialDescriptor).optional(),
    authenticatorSelection: z.looseObject({ residentKey: z.string().optional(), userVerification: z.string().optional() }).optional(),
    attestation: z.string().optional(),
  })
  .describe('PublicKeyCredentialCreationOptionsJSON: pass to startRegistration({optionsJSON})')
  .meta({ id: 'PasskeyCreationOptions' });

const RequestOptions = z
  .looseObject({
    challenge: z.string(),
    rpId: z.string().optional(),
    allowCredentials: z.array(CredentialDescriptor).optional(),
    timeout: z.number().int().optional(),
    userVerification: z.string().optional(),
  })
  .describe('PublicKeyCredentialRequestOptionsJSON: pass to startAuthentication({optionsJSON})')
  .meta({ id: 'PasskeyRequestOptions' });

const Begin = (options: z.ZodType) =>
  z.object({ challenge_id: z.string().describe('Send it back with the response; single use'), expires_at: Timestamp, options });

const Passkey = z
  .object({
    passkey_id: z.uuid(),
    name: z.string(),
    active: z.boolean().describe('An inactive passkey does not sign in until it is made active again'),
    device_type: z.enum(['singleDevice', 'multiDevice']).describe('multiDevice: a synced passkey'),
    backed_up: z.boolean(),
    transports: z.array(z.string()),
    aaguid: z.string().describe("The authenticator model's AAGUID (zeros when it does not say)"),
    created_at: Timestamp,
    last_used_at: Timestamp.nullable(),
  })
  .meta({ id: 'Passkey' });

const passkeyView = (p: PasskeyRow): z.infer<typeof Passkey> => ({
  passkey_id: p.id,
  name: p.name,
  active: p.active,
  device_type: p.device_type,
  backed_up: p.backed_up,
  transports: p.transports,
  aaguid: p.aaguid,
  created_at: iso(p.created_at),
  last_used_at: isoOrNull(p.last_used_at),
});

const Params = z.object({ passkey_id: z.uuid() });
const Name = text(100);

export default [
  route({
    method: 'post',
    path: '/auth/passkeys/register/begin',
    summary: 'Begin registering a passkey for the signed-in user; returns WebAuthn creation options',
    tags,
    access: 'session',
    recentSignIn: true,
    responses: { 200: { description: 'Options for navigator.credentials.create() and the challenge id', schema: Begin(CreationOptions) } },
    async handler({ c, user }) {
      const begun = await passkeys.beginRegistration(c, user);
      return { body: { challenge_id: begun.challengeId, expires_at: iso(begun.expiresAt), options: begun.options } };
    },
  }),

  route({
    method: 'post',
    path: '/auth/passkeys/register/complete',
    summary: 'Complete the registration: verify the attestation and store the passkey',
    tags,
    access: 'session',
    recentSignIn: true,
    body: z.object({
      challenge_id: ChallengeId,
      credential: RegistrationCredential,
      name: Name.optional().describe('A name to tell passkeys apart; default "Passkey <date>"'),
    }),
    responses: { 201: { description: 'The new passkey', schema: Passkey } },
    async handler({ c, user, body, meta }) {
      return { status: 201, body: passkeyView(await passkeys.completeRegistration(c, user.id, body, meta)) };
    },
  }),

  route({
    method: 'post',
    path: '/auth/passkeys/login/begin',
    summary: 'Begin a passkey login, for a named account or a discoverable passkey; returns WebAuthn request options',
    tags,
    access: 'public',
    body: z.object({
      username: z.string().trim().min(1).max(254).optional().describe('Username or email; omit it to let the authenticator offer its passkeys for this site'),
    }),
    responses: {
      200: {
        description: 'Options for navigator.credentials.get() and the challenge id (the same shape whether or not the account exists)',
        schema: Begin(RequestOptions),
      },
    },
    async handler({ c, body, meta }) {
      const begun = await passkeys.beginLogin(c, body.username, meta);
      return { body: { challenge_id: begun.challengeId, expires_at: iso(begun.expiresAt), options: begun.options } };
    },
  }),

  route({
    method: 'post',
    path: '/auth/passkeys/login/complete',
    summary: 'Complete a passkey login; returns a JWT, as password login does',
    tags,
    access: 'public',
    body: z.object({ challenge_id: ChallengeId, credential: AuthenticationCredential }),
    responses: {
      200: { description: 'Session token, the user and the passkey used', schema: z.object({ session: Session, user: User, passkey_id: z.uuid() }) },
    },
    async handler({ c, body, meta }) {
      const { user, session, passkey } = await passkeys.completeLogin(c, body, meta);
      return { body: { session, user: userOut(user), passkey_id: passkey.id } };
    },
  }),

  route({
    method: 'get',
    path: '/auth/passkeys/list',
    summary: "The signed-in user's passkeys",
    tags,
    access: 'session',
    query: PageQuery,
    responses: { 200: { description: 'Passkeys, newest first', schema: pageOf(Passkey) } },
    async handler({ user, query, reader }) {
      const { items, total } = await passkeys.listPasskeys(await reader(), user.id, { page: query.page, pageSize: query.page_size });
      return { body: { items: items.map(passkeyView), page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'patch',
    path: '/auth/passkeys/{passkey_id}',
    summary: 'Rename a passkey, or make it inactive or active again',
    tags,
    access: 'session',
    recentSignIn: { when: (b) => b.active === true, description: 'To make a passkey active' },
    params: Params,
    body: z
      .object({
        name: Name.optional(),
        active: z.boolean().optional(),
        state: z.enum(['active', 'inactive']).optional().describe('The same as active, in words: active (true) or inactive (false)'),
      })
      .refine(
        (b) => b.name !== undefined || b.active !== undefined || b.state !== undefined,
        'name at least one field to change: name, active (true or false) or state (active or inactive)',
      )
      .refine((b) => b.active === undefined || b.state === undefined || b.active === (b.state === 'active'), {
        message: 'active and state disagree: give one',
        path: ['state'],
      }),
    responses: { 200: { description: 'The passkey', schema: Passkey } },
    async handler({ c, user, params, body, meta }) {
      const { state, ...patch } = body;
      if (state !== undefined) patch.active = state === 'active';
      return { body: passkeyView(await passkeys.changePasskey(c, user.id, params.passkey_id, patch, meta)) };
    },
  }),

  route({
    method: 'delete',
    path: '/auth/passkeys/{passkey_id}',
    summary: 'Delete a passkey (it no longer signs in; the authenticator keeps its copy until removed there)',
    tags,
    access: 'session',
    params: Params,
    responses: { 204: { description: 'Deleted' } },
    async handler({ c, user, params, meta }) {
      await passkeys.removePasskey(c, user.id, params.passkey_id, meta);
      return { status: 204 };
    },
  }),
];
