import { z } from 'zod';
import { route, type HandlerInput } from '../../route';
import type { Access } from '../../context';
import { Email, PageQuery, pageOf, text, wholeNumber } from '../../schemas/common';
import { Algorithm, Environment, Fingerprint, FormBoolean, Key, Label, Passphrase, Profile } from '../../schemas/key-fields';
import { defaultAlgorithm, profileAllows, type KeyAlgorithm } from '../../../lib/pgp/profiles';
import { jobResponses } from '../../schemas/job-replies';
import { submitAndReply } from '../../job-reply';
import { newToken } from '../../../lib/tokens';
import { checkKeyLimit, disableKey, keyGeneratedData, keyPage, newGeneration, newLineage, requireKey, storeKey } from '../../../lib/keys/key-catalog';
import { emitEvent } from '../../../lib/events';
import { inheritedOwners, resyncLinkedTo } from '../../../lib/teams/team-access';
import { keyOut } from '../../../lib/keys/key-view';
import { currentUser } from '../../../lib/accounts/user-accounts';
import { newJobId } from '../../../lib/jobs/job-records';
import { sealGenerateLock } from '../../../jobs/generate-key';

const tags = ['PGP keys'];

const GenerateKeyForm = z
  .object({
    label: Label,
    environment: Environment.optional().describe('Default: production'),
    env: Environment.optional().describe('Another name for environment (the one the illustrative create-key sample uses)'),
    name: text(100).describe('Name in the OpenPGP user id'),
    email: Email.describe('Email in the OpenPGP user id'),
    passphrase: Passphrase,
    profile: Profile.default('rfc4880'),
    algorithm: Algorithm.optional().describe('Default: curve25519 (rfc4880 and rfc9580), ml-kem-768+x25519 (pqc); RSA is rfc4880 only'),
    expires_in_days: wholeNumber(1, 3650).optional(),
  })
  .refine((b) => !b.env || !b.environment || b.env === b.environment, { message: 'env and environment name the same field: give one', path: ['env'] })
  .refine((b) => !b.algorithm || profileAllows(b.profile, b.algorithm), {
    message: 'the profile makes no keys of this algorithm (rfc4880: curve25519, rsa3072, rsa4096; rfc9580: curve25519; pqc: ml-kem-768+x25519)',
    path: ['algorithm'],
  })
  .transform((b) => ({ ...b, algorithm: (b.algorithm ?? defaultAlgorithm(b.profile)) as KeyAlgorithm }));

type Input = HandlerInput<Access, unknown, unknown, unknown>;

/** Curve25519 and post-quantum keys take milliseconds and are made in the request; RSA goes to the `crypto` queue. */
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
      profile: form.profile,
      key_ttl_days: form.expires_in_days ?? null,
    },
    form.passphrase,
  );
  if (!form.algorithm.startsWith('rsa')) {
    const first = await newGeneration(c, { ...spec, user_id: userId }, 1);
    const { lineage, key } = await storeKey(c, userId, spec, first, meta);
    await emitEvent(c, userId, 'keys.generated', keyGeneratedData(spec, first));
    await resyncLinkedTo(c, userId, 'keys.generated', meta);
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

export default [
  route({
    method: 'post',
    path: '/keys/generate-key',
    summary: 'Generate an OpenPGP key pair of a profile (rfc4880, rfc9580, pqc): 201 at once; RSA as a job: 202',
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
    body: z.object({ label: Label, env: Environment.default('production'), profile: Profile.default('rfc4880') }),
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
        profile: body.profile,
        algorithm: defaultAlgorithm(body.profile),
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
    async handler({ c, user, query, reader }) {
      const now = c.clock.now();
      const r = await reader();
      const { items, total } = await keyPage(r, {
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
        r,
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
        await emitEvent(c, user.id, 'keys.disabled', { lineage_id: view.lineage.id, fingerprint: view.current.fingerprint, label: view.lineage.label });
      if (lineage.changed) await resyncLinkedTo(c, user.id, 'keys.disabled', meta);
      return { body: keyOut(lineage.lineage, view.current, c.clock.now()) };
    },
  }),
];
