import { z } from 'zod';
import { route, type RouteDef } from '../../route';
import { PageQuery, Timestamp, pageOf, wholeNumber } from '../../schemas/common';
import { Fingerprint, Profile } from '../../schemas/key-fields';
import { jobResponses } from '../../schemas/job-replies';
import { submitAndReply } from '../../job-reply';
import { encryptionTarget, jobDeadline } from '../../../lib/keys/key-catalog';
import { requireKeyWithPassphrase } from '../../../lib/keys/passphrases';
import { passphraseAad } from '../../../jobs/tracked';
import type { RewrapRequest } from '../../../jobs/rewrap-files';
import type { Container } from '../../../lib/container';
import type { RequestMeta } from '../../../db/audit';
import { cancelDestruction, DESTRUCTION_WAIT_DAYS, listGenerations, scheduleDestruction, updateKeySettings } from '../../../lib/lifecycle/key-lifecycle';

const tags = ['Key lifecycle'];
const KeyParams = z.object({ fingerprint: Fingerprint });
const GenerationNumber = wholeNumber(1, 1_000_000);

const Lifecycle = z
  .object({
    lineage_id: z.uuid(),
    fingerprint: z.string().describe('The current generation'),
    current_generation: z.number().int(),
    min_decryption_generation: z.number().int().describe('Generations below it are retired: no decrypt, no rewrap (409 generation_retired)'),
    disabled_at: Timestamp.nullable(),
    destroy_after: Timestamp.nullable().describe('Whole-key destruction: when it is due'),
    destroyed_at: Timestamp.nullable(),
  })
  .meta({ id: 'KeyLifecycle' });

const Generation = z
  .object({
    generation: z.number().int(),
    fingerprint: z.string(),
    algorithm: z.string(),
    profile: Profile,
    status: z.enum(['current', 'rotated', 'retired', 'pending_destruction', 'destroyed']),
    created_at: Timestamp,
    rotated_at: Timestamp.nullable(),
    expires_at: Timestamp.nullable(),
    destroy_after: Timestamp.nullable(),
    destroyed_at: Timestamp.nullable(),
    safe_to_retire: z.boolean().describe('Rotated, and no decrypt since the later of its rotation and KEY_RETIRE_SAFE_DAYS ago'),
    usage: z.object({
      files_encrypted: z.number().int(),
      bytes_encrypted: z.number().int(),
      files_decrypted: z.number().int(),
      bytes_decrypted: z.number().int(),
      last_decrypt_at: Timestamp.nullable(),
      files_rewrapped_from: z.number().int().describe('Files rewrapped or re-encrypted away from this generation'),
      files_rewrapped_to: z.number().int().describe('Files rewrapped or re-encrypted to this generation'),
    }),
  })
  .meta({ id: 'KeyGeneration' });

const Destruction = z
  .object({
    scope: z.enum(['generation', 'key']),
    generation: z.number().int().nullable(),
    fingerprint: z.string(),
    destroy_after: Timestamp.optional(),
    key: Lifecycle,
  })
  .meta({ id: 'KeyDestruction' });

const RewrapForm = z.object({
  fingerprint: Fingerprint.describe("Any generation's fingerprint of the key"),
  passphrase: z.string().min(1).max(1024),
  mode: z
    .enum(['rewrap', 'reencrypt'])
    .default('rewrap')
    .describe(
      'rewrap: new session-key packet, same encrypted data; reencrypt: a fresh session key. To a v6 (rfc9580, pqc) generation files are always encrypted again, as SEIPDv2',
    ),
});

/**
 * The key, opened with its passphrase (the one check: limited, audited as keys.decrypt), and its current
 * generation, which must be able to take a job started now (409 key_disabled, key_expired,
 * key_expires_during_job). Checked once per request: in the pre-upload check, else in the handler.
 */
async function rewrapTarget(c: Container, userId: string, body: z.infer<typeof RewrapForm>, meta: RequestMeta) {
  const view = await requireKeyWithPassphrase(c, { userId, fingerprint: body.fingerprint, passphrase: body.passphrase, action: 'keys.decrypt', meta });
  const now = c.clock.now();
  encryptionTarget(view, now, jobDeadline(c, now));
  return view;
}

export default [
  route({
    method: 'post',
    path: '/keys/rewrap',
    summary:
      "Address encrypted files (field `files`) to the key's current generation: `rewrap` swaps the session-key packet only, `reencrypt` encrypts again under a new session key",
    tags,
    access: 'auth',
    scope: 'crypto:decrypt',
    multipart: {
      description: 'Fields: fingerprint, passphrase, mode; files (OpenPGP messages, binary or armored)',
      files: true,
      check: (body, { c, user, meta }) => rewrapTarget(c, user.id, body, meta),
    },
    body: RewrapForm,
    responses: jobResponses,
    async handler({ c, ctx, user, body, upload, meta, checked }) {
      return submitAndReply(c, ctx, { id: upload.id, userId: user.id, kind: 'rewrap', requestId: meta.requestId, body, upload }, async () => {
        const view = await checked();
        const request: RewrapRequest = { lineage_id: view.lineage.id, fingerprint: view.named.fingerprint, mode: body.mode };
        return {
          request,
          enqueue: (jobId) =>
            c.jobs.enqueue('rewrap-files', { job_id: jobId, sealed_passphrase: c.sealer.seal(body.passphrase, passphraseAad(jobId)) }, { jobId, meta }),
        };
      });
    },
  }),

  route({
    method: 'get',
    path: '/keys/{fingerprint}/generations',
    summary: "Every generation of a key (any generation's fingerprint): state, dates, usage and whether it is safe to retire",
    tags,
    access: 'auth',
    scope: 'keys:read',
    params: KeyParams,
    query: PageQuery,
    responses: { 200: { description: 'The key and a page of its generations, newest first', schema: Lifecycle.extend(pageOf(Generation).shape) } },
    async handler({ c, user, params, query, meta, reader }) {
      return { body: await listGenerations(c, user.id, params.fingerprint, { page: query.page, pageSize: query.page_size }, meta, await reader()) };
    },
  }),

  route({
    method: 'patch',
    path: '/keys/{fingerprint}/settings',
    summary: "A key's lifecycle settings: `min_decryption_generation` retires older generations (and can be lowered again until they are destroyed)",
    tags,
    access: 'auth',
    scope: 'keys:write',
    params: KeyParams,
    body: z.object({ min_decryption_generation: GenerationNumber.optional() }),
    responses: { 200: { description: 'The settings now', schema: Lifecycle } },
    async handler({ c, user, params, body, meta }) {
      return { body: await updateKeySettings(c, user.id, params.fingerprint, body, meta) };
    },
  }),

  route({
    method: 'post',
    path: '/keys/{fingerprint}/destruction',
    summary: `Schedule destruction after ${DESTRUCTION_WAIT_DAYS.min}-${DESTRUCTION_WAIT_DAYS.max} days: of one retired generation, or (without \`generation\`) of the whole key, which is disabled at once`,
    tags,
    access: 'auth',
    scope: 'keys:write',
    params: KeyParams,
    body: z.object({
      generation: GenerationNumber.optional().describe('A retired generation; omit for the whole key'),
      waiting_days: z.number().int().min(DESTRUCTION_WAIT_DAYS.min).max(DESTRUCTION_WAIT_DAYS.max).default(DESTRUCTION_WAIT_DAYS.default),
    }),
    responses: { 202: { description: 'Scheduled; cancel it before `destroy_after`', schema: Destruction } },
    async handler({ c, user, params, body, meta }) {
      return { status: 202, body: await scheduleDestruction(c, user.id, params.fingerprint, body, meta) };
    },
  }),

  route({
    method: 'delete',
    path: '/keys/{fingerprint}/destruction',
    summary: 'Cancel a scheduled destruction (of `generation`, or of the whole key; a key stays disabled)',
    tags,
    access: 'auth',
    scope: 'keys:write',
    params: KeyParams,
    query: z.object({ generation: GenerationNumber.optional() }),
    responses: { 200: { description: 'Cancelled', schema: Destruction } },
    async handler({ c, user, params, query, meta }) {
      return { body: await cancelDestruction(c, user.id, params.fingerprint, query, meta) };
    },
  }),
] as RouteDef[];
