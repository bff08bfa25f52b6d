import { z } from 'zod';
import { route, type HandlerInput } from '../../route';
import type { Access } from '../../context';
import { Email, PageQuery, pageOf, text, wholeNumber } from '../../schemas/common';
import { Algorithm, Environment, Fingerprint, FormBoolean, Key, Label, Passphrase } from '../../schemas/key-fields';
import { jobResponses } from '../../schemas/job-replies';
import { submitAndReply } from '../../job-reply';
import { newToken } from '../../../lib/tokens';
import { readRecipientKey } from '../../../lib/pgp/keys';
import {
  auditKeyRefusal,
  checkKeyLimit,
  disableKey,
  encryptionTarget,
  jobDeadline,
  keyGeneratedData,
  keyPage,
  newGeneration,
  newLineage,
  requireKey,
  signingTarget,
  storeKey,
} from '../../../lib/keys/key-catalog';
import { keepSuppliedKey, resolveSigner } from '../../../lib/keys/signers';
import { emitEvent } from '../../../lib/events';
import { inheritedOwners, resyncLinkedTo } from '../../../lib/teams/team-access';
import { requireKeyWithPassphrase } from '../../../lib/keys/passphrases';
import type { KeyView } from '../../../db/keys';
import { keyOut } from '../../../lib/keys/key-view';
import { currentUser } from '../../../lib/accounts/user-accounts';
import { newJobId } from '../../../lib/jobs/job-records';
import { AppError } from '../../../lib/errors';
import type { RequestMeta } from '../../../db/audit';
import type { Container } from '../../../lib/container';
import { passphraseAad } from '../../../jobs/tracked';
import { sealGenerateLock } from '../../../jobs/generate-key';
import type { EncryptRequest } from '../../../jobs/encrypt-files';
import type { Signer } from '../../../jobs/verify-files';

const tags = ['PGP keys'];

const GenerateKeyForm = z
  .object({
    label: Label,
    environment: Environment.optional().describe('Default: production'),
    env: Environment.optional().describe('Another name for environment (the one the illustrative create-key sample uses)'),
    name: text(100).describe('Name in the OpenPGP user id'),
    email: Email.describe('Email in the OpenPGP user id'),
    passphrase: Passphrase,
    algorithm: Algorithm.default('curve25519'),
    expires_in_days: wholeNumber(1, 3650).optional(),
  })
  .refine((b) => !b.env || !b.environment || b.env === b.environment, { message: 'env and environment name the same field: give one', path: ['env'] });

type Input = HandlerInput<Access, unknown, unknown, unknown>;

/** Curve25519 keys take milliseconds and are made in the request; RSA goes to the `crypto` queue. */
async function generate(input: Pick<Input, 'c' | 'ctx' | 'meta'>, userId: string, form: z.infer<typeof GenerateKeyForm>) {
  const { c, ctx, meta } = input;
  await checkKeyLimit(c, userId); // early 402, before the KDF
  const spec = await newLineage(
    c,
    {
      label: form.label,
      environment: form.environment ?? form.env ?? 'production',
      uid_name: form.name,
      uid_email: form.email,
      algorithm: form.algorithm,
      key_ttl_days: form.expires_in_days ?? null,
    },
    form.passphrase,
  );
  if (form.algorithm === 'curve25519') {
    const first = await newGeneration(c, { ...spec, user_id: userId }, 1);
    const { lineage, key } = await storeKey(c, userId, spec, first, meta);
    await emitEvent(c, userId, 'key.generated', keyGeneratedData(spec, first));
    await resyncLinkedTo(c, userId, 'key.generated', meta);
    return { status: 201, body: keyOut(lineage, key, c.clock.now()) };
  }
  // The lock stays out of the job row: it travels sealed in the queue payload, with the public key it
  // belongs to (a changed job row cannot seal the first generation to another key).
  const { unlock_locked, unlock_public, ...stored } = spec;
  return submitAndReply(c, ctx, { id: newJobId(), userId, kind: 'generate-key', requestId: meta.requestId, body: form }, async () => ({
    request: { lineage: stored },
    enqueue: (jobId) =>
      c.jobs.enqueue('generate-key', { job_id: jobId, sealed_lock: sealGenerateLock(c.sealer, jobId, { unlock_public, unlock_locked }) }, { jobId, meta }),
  }));
}

const EncryptForm = z
  .object({
    fingerprint: Fingerprint.optional(),
    public_key: z
      .string()
      .max(1 << 20)
      .optional(),
    armor: FormBoolean.default(false),
    compress: FormBoolean.default(false),
    sign_with: Fingerprint.optional().describe('Sign and encrypt: a key of yours whose current generation signs (one-pass signature inside the encryption)'),
    passphrase: z.string().min(1).max(1024).optional().describe("sign_with's passphrase"),
  })
  .refine((b) => Boolean(b.fingerprint) !== Boolean(b.public_key), { message: 'give exactly one of fingerprint and public_key', path: ['fingerprint'] })
  .refine((b) => Boolean(b.sign_with) === Boolean(b.passphrase), { message: 'sign_with and passphrase go together', path: ['sign_with'] });

const DecryptForm = z
  .object({
    fingerprint: Fingerprint,
    passphrase: z.string().min(1).max(1024),
    verify_with: Fingerprint.optional().describe('Decrypt and verify: a stored key whose generations may have signed'),
    verify_public_key: z
      .string()
      .max(1 << 20)
      .optional()
      .describe("Decrypt and verify: the signer's armored public key"),
    require_signature: FormBoolean.default(false).describe(
      'With verify_with or verify_public_key: a file without a valid signature fails (no plaintext is published)',
    ),
  })
  .refine((b) => !(b.verify_with && b.verify_public_key), { message: 'give at most one of verify_with and verify_public_key', path: ['verify_with'] })
  .refine((b) => !b.require_signature || Boolean(b.verify_with || b.verify_public_key), {
    message: 'require_signature needs verify_with or verify_public_key',
    path: ['require_signature'],
  });

/** Sign and encrypt: the signing key, opened by its passphrase (the one limited, audited check), if it may sign. */
const signerForEncryption = (c: Container, userId: string, body: z.infer<typeof EncryptForm>, meta: RequestMeta): Promise<KeyView | undefined> =>
  body.sign_with
    ? requireKeyWithPassphrase(c, { userId, fingerprint: body.sign_with, passphrase: body.passphrase!, action: 'keys.sign', meta }).then((view) => {
        signingTarget(view, c.clock.now());
        return view;
      })
    : Promise.resolve(undefined);

/** Decrypt and verify: whose signatures are checked (a stored key the caller may read, or a supplied public key). */
const signerForDecryption = (c: Container, userId: string, body: z.infer<typeof DecryptForm>, meta: RequestMeta): Promise<Signer | undefined> =>
  body.verify_with || body.verify_public_key
    ? resolveSigner(c, userId, { fingerprint: body.verify_with, publicKey: body.verify_public_key }, meta)
    : Promise.resolve(undefined);

/** What an encryption needs, looked up once per request: in the pre-upload check, else in the handler. */
async function encryptionParties(c: Container, userId: string, body: z.infer<typeof EncryptForm>, meta: RequestMeta) {
  const recipient = await recipientFor(c, userId, body, meta);
  return { recipient, signer: await signerForEncryption(c, userId, body, meta) };
}

/** What a decryption needs, looked up once per request: the key opened by its passphrase, and the signer to verify with. */
async function decryptionParties(c: Container, userId: string, body: z.infer<typeof DecryptForm>, meta: RequestMeta) {
  const view = await keyForDecryption(c, userId, body, meta);
  return { view, signer: await signerForDecryption(c, userId, body, meta) };
}

/** Where an encryption goes: a stored key's current generation (409 if it may not encrypt, audited) or a supplied public key. */
async function recipientFor(c: Container, userId: string, body: z.infer<typeof EncryptForm>, meta: RequestMeta): Promise<EncryptRequest['recipient']> {
  if (!body.fingerprint) return { type: 'supplied', fingerprint: (await readRecipientKey(body.public_key!, c.clock.now())).fingerprint };
  const view = await requireKey(c, userId, body.fingerprint, meta, 'encrypt');
  try {
    const now = c.clock.now();
    const target = encryptionTarget(view, now, jobDeadline(c, now)); // a key expiring before the job's deadline is refused up front
    return { type: 'stored', key_id: target.id, fingerprint: target.fingerprint, requested_fingerprint: view.named.fingerprint };
  } catch (err) {
    await auditKeyRefusal(c, userId, 'keys.encrypt', body.fingerprint, err instanceof AppError ? err.code : 'error', meta);
    throw err;
  }
}

/**
 * The key to decrypt with, once the passphrase has opened it (limited, audited; lib/keys/passphrases):
 * a wrong one is a clear 422 before any job, and before the upload when the fields come first.
 */
const keyForDecryption = (c: Container, userId: string, body: z.infer<typeof DecryptForm>, meta: RequestMeta): Promise<KeyView> =>
  requireKeyWithPassphrase(c, { userId, fingerprint: body.fingerprint, passphrase: body.passphrase, action: 'keys.decrypt', meta });

export default [
  route({
    method: 'post',
    path: '/keys/generate-key',
    summary: 'Generate an OpenPGP key pair (curve25519 at once: 201; RSA as a job: 202)',
    tags,
    access: 'auth',
    scope: 'keys:write',
    multipart: { description: 'Form fields (JSON with the same fields is accepted too)' },
    body: GenerateKeyForm,
    responses: { 201: { description: 'The new key', schema: Key }, ...jobResponses },
    async handler(input) {
      return generate(input, input.user.id, input.body);
    },
  }),

  route({
    method: 'post',
    path: '/keys',
    summary: 'Create a key from a label and environment (the illustrative sample); its passphrase is generated and shown once',
    tags,
    access: 'auth',
    scope: 'keys:write',
    body: z.object({ label: Label, env: Environment.default('production') }),
    responses: {
      201: {
        description: 'The new key and its passphrase',
        schema: Key.extend({ env: z.string(), passphrase: z.string().describe('Shown once: needed to decrypt') }),
      },
    },
    async handler(input) {
      const { c, user, body } = input;
      const passphrase = newToken();
      const owner = await currentUser(c, user.id);
      const reply = await generate(input, user.id, {
        label: body.label,
        environment: body.env,
        name: body.label,
        email: owner.email,
        passphrase,
        algorithm: 'curve25519',
      });
      return { status: 201, headers: { 'Cache-Control': 'no-store' }, body: { ...(reply.body as object), env: body.env, passphrase } };
    },
  }),

  route({
    method: 'get',
    path: '/keys/list',
    summary: 'List keys (never private material); filters: environment, label, active',
    tags,
    access: 'auth',
    scope: 'keys:read',
    query: PageQuery.extend({ environment: Environment.optional(), label: Label.optional(), active: FormBoolean.optional() }),
    responses: { 200: { description: 'A page of keys', schema: pageOf(Key) } },
    async handler({ c, user, query }) {
      const now = c.clock.now();
      const { items, total } = await keyPage(c, {
        userId: user.id,
        environment: query.environment,
        label: query.label,
        active: query.active,
        inherited: true,
        now,
        page: query.page,
        pageSize: query.page_size,
      });
      // Keys inherited through team access are listed with their owner (lib/teams/team-access.ts).
      const owners = await inheritedOwners(
        c,
        user.id,
        items.map((i) => i.lineage),
      );
      const list = items.map((i) => ({ ...keyOut(i.lineage, i.current, now), inherited: owners.has(i.lineage.id), owner: owners.get(i.lineage.id) ?? null }));
      return { body: { items: list, page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'post',
    path: '/keys/get-public-key',
    summary: "The armored public key of a key's current generation, by any generation's fingerprint (JSON, or application/pgp-keys when asked for)",
    tags,
    access: 'auth',
    scope: 'keys:read',
    body: z.object({ fingerprint: Fingerprint }),
    responses: {
      200: {
        description: 'The public key',
        schema: z.object({ fingerprint: z.string(), requested_fingerprint: z.string(), public_key: z.string(), key: Key }),
      },
    },
    async handler({ c, ctx, user, body, meta }) {
      const view = await requireKey(c, user.id, body.fingerprint, meta, 'read');
      if (ctx.accepts('application/json', 'application/pgp-keys') === 'application/pgp-keys') {
        ctx.type = 'application/pgp-keys';
        ctx.set('Content-Disposition', `attachment; filename="${view.current.fingerprint}.asc"`);
        ctx.body = view.current.public_armored;
        return;
      }
      return {
        body: {
          fingerprint: view.current.fingerprint,
          requested_fingerprint: view.named.fingerprint,
          public_key: view.current.public_armored,
          key: keyOut(view.lineage, view.current, c.clock.now()),
        },
      };
    },
  }),

  route({
    method: 'post',
    path: '/keys/disable-key',
    summary: 'Disable a key: it no longer encrypts or rotates (it still decrypts, so no data is stranded)',
    tags,
    access: 'auth',
    scope: 'keys:write',
    body: z.object({ fingerprint: Fingerprint }),
    responses: { 200: { description: 'The disabled key', schema: Key } },
    async handler({ c, user, body, meta }) {
      const view = await requireKey(c, user.id, body.fingerprint, meta);
      const lineage = await disableKey(c, user.id, view, meta);
      if (lineage.changed)
        await emitEvent(c, user.id, 'key.disabled', { lineage_id: view.lineage.id, fingerprint: view.current.fingerprint, label: view.lineage.label });
      if (lineage.changed) await resyncLinkedTo(c, user.id, 'key.disabled', meta);
      return { body: keyOut(lineage.lineage, view.current, c.clock.now()) };
    },
  }),

  route({
    method: 'post',
    path: '/keys/encrypt',
    summary: "Encrypt one or more files (field `files`, repeatable) to a stored key's fingerprint or a supplied armored public key",
    tags,
    access: 'auth',
    scope: 'crypto:encrypt',
    multipart: {
      description: 'Fields: fingerprint or public_key (text or file), armor, compress, sign_with and passphrase (sign and encrypt); files',
      files: true,
      textFileFields: ['public_key'],
      check: (body, { c, user, meta }) => encryptionParties(c, user.id, body, meta),
    },
    body: EncryptForm,
    responses: jobResponses,
    async handler({ c, ctx, user, body, upload, meta, checked }) {
      return submitAndReply(c, ctx, { id: upload.id, userId: user.id, kind: 'encrypt', requestId: meta.requestId, body, upload }, async () => {
        const { recipient, signer } = await checked();
        if (body.public_key) await keepSuppliedKey(c, upload.id, body.public_key);
        const request: EncryptRequest = {
          recipient,
          armor: body.armor,
          compress: body.compress,
          ...(signer ? { sign_with: { lineage_id: signer.lineage.id, fingerprint: signer.current.fingerprint } } : {}),
        };
        const sealed = (jobId: string) => (body.passphrase ? { sealed_passphrase: c.sealer.seal(body.passphrase, passphraseAad(jobId)) } : {});
        return { request, enqueue: (jobId) => c.jobs.enqueue('encrypt-files', { job_id: jobId, ...sealed(jobId) }, { jobId, meta }) };
      });
    },
  }),

  route({
    method: 'post',
    path: '/keys/decrypt',
    summary: 'Decrypt one or more files (field `files`) with a key fingerprint (any generation) and its passphrase',
    tags,
    access: 'auth',
    scope: 'crypto:decrypt',
    multipart: {
      description: 'Fields: fingerprint, passphrase, verify_with or verify_public_key (text or file), require_signature; files',
      files: true,
      textFileFields: ['verify_public_key'],
      check: (body, { c, user, meta }) => decryptionParties(c, user.id, body, meta),
    },
    body: DecryptForm,
    responses: jobResponses,
    async handler({ c, ctx, user, body, upload, meta, checked }) {
      return submitAndReply(c, ctx, { id: upload.id, userId: user.id, kind: 'decrypt', requestId: meta.requestId, body, upload }, async () => {
        const { view, signer } = await checked();
        if (body.verify_public_key) await keepSuppliedKey(c, upload.id, body.verify_public_key);
        return {
          request: {
            lineage_id: view.lineage.id,
            fingerprint: view.named.fingerprint,
            ...(signer ? { verify_with: signer, require_signature: body.require_signature } : {}),
          },
          enqueue: (jobId) =>
            c.jobs.enqueue('decrypt-files', { job_id: jobId, sealed_passphrase: c.sealer.seal(body.passphrase, passphraseAad(jobId)) }, { jobId, meta }),
        };
      });
    },
  }),
];
