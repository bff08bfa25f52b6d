import { z } from 'zod';
import { route } from '../../route';
import { PageQuery, Timestamp, instant, pageOf } from '../../schemas/common';
import { Fingerprint, Passphrase, Profile } from '../../schemas/key-fields';
import { jobResponses } from '../../schemas/job-replies';
import { submitAndReply } from '../../job-reply';
import { ROTATION_DAYS } from '../profile/account-profile';
import { invalid } from '../../../lib/errors';
import { requireKey } from '../../../lib/keys/key-catalog';
import { newJobId } from '../../../lib/jobs/job-records';
import { manualRotationTarget, rotationHistory, rotationOut, setRotationSchedule } from '../../../lib/lifecycle/rotation';
import { currentUser } from '../../../lib/accounts/user-accounts';
import { rotationPassphraseAad } from '../../../jobs/rotate-key';

const tags = ['Key rotation'];
const KeyParams = z.object({ fingerprint: Fingerprint });

const RotationEntry = z
  .object({
    rotation_id: z.uuid(),
    lineage_id: z.uuid(),
    old_fingerprint: z.string(),
    new_fingerprint: z.string().nullable(),
    from_generation: z.number().int(),
    trigger: z.enum(['manual', 'schedule', 'policy']),
    actor_id: z.string().nullable().describe('The user who asked; null for the scheduler'),
    status: z.enum(['succeeded', 'failed']),
    error: z.object({ code: z.string(), message: z.string() }).nullable(),
    job_id: z.string().nullable(),
    created_at: Timestamp,
  })
  .meta({ id: 'RotationEntry' });

const HistoryQuery = PageQuery.extend({
  from: instant.optional().describe('Entries at or after this time (ISO 8601)'),
  to: instant.optional().describe('Entries before this time'),
  trigger: z.enum(['manual', 'schedule', 'policy']).optional(),
  status: z.enum(['succeeded', 'failed']).optional(),
});

const Schedule = z
  .object({
    fingerprint: z.string(),
    mode: z.enum(['policy', 'interval', 'off']),
    rotation_interval_days: z.number().int().nullable(),
    effective_rotation_interval_days: z.number().int().nullable().describe('What the scheduler uses: the key’s own interval, or the account policy'),
    next_rotation_at: Timestamp.nullable(),
    profile: Profile.describe('The profile of the next generations'),
  })
  .meta({ id: 'RotationSchedule' });

export default [
  route({
    method: 'post',
    path: '/keys/{fingerprint}/rotate',
    summary:
      'Rotate a key now (a rotation job). Optionally changes the passphrase when the current one is given, and the profile of this and later generations.',
    tags,
    access: 'auth',
    scope: 'keys:write',
    params: KeyParams,
    body: z
      .object({
        current_passphrase: z.string().min(1).max(1024).optional(),
        new_passphrase: Passphrase.optional(),
        profile: Profile.optional().describe("The new generation's profile, kept for the lineage's later rotations; default: the lineage's rotation_profile"),
      })
      .refine((b) => !b.new_passphrase || b.current_passphrase, { message: 'a new passphrase needs the current one', path: ['current_passphrase'] }),
    responses: jobResponses,
    async handler({ c, ctx, user, params, body, meta }) {
      return submitAndReply(
        c,
        ctx,
        { id: newJobId(), userId: user.id, kind: 'rotate-key', requestId: meta.requestId, body: { fingerprint: params.fingerprint, ...body } },
        async () => {
          const view = await manualRotationTarget(c, { userId: user.id, fingerprint: params.fingerprint, currentPassphrase: body.current_passphrase, meta });
          const passphrases = body.new_passphrase ? JSON.stringify({ current: body.current_passphrase, next: body.new_passphrase }) : undefined;
          return {
            request: {
              lineage_id: view.lineage.id,
              from_generation: view.current.generation,
              fingerprint: view.current.fingerprint,
              actor_id: user.id,
              ...(body.profile ? { profile: body.profile } : {}),
            },
            enqueue: (jobId) =>
              c.jobs.enqueue(
                'rotate-key',
                { job_id: jobId, sealed_passphrases: passphrases && c.sealer.seal(passphrases, rotationPassphraseAad(jobId)) },
                { jobId, meta },
              ),
          };
        },
      );
    },
  }),

  route({
    method: 'post',
    path: '/keys/{fingerprint}/rotation-schedule',
    summary: `Set the key's rotation interval in days (${ROTATION_DAYS.min}–${ROTATION_DAYS.max}), null for off, or follow the account policy; and/or the profile of its next generations`,
    tags,
    access: 'auth',
    scope: 'keys:write',
    params: KeyParams,
    body: z
      .strictObject({
        rotation_interval_days: z.number().int().min(ROTATION_DAYS.min).max(ROTATION_DAYS.max).nullable().optional().describe('null: scheduled rotation off'),
        use_account_policy: z.literal(true).optional().describe("Follow the account's rotation_interval_days"),
        profile: Profile.optional().describe('The profile scheduled (and manual) rotations make the next generations with'),
      })
      .refine((b) => b.rotation_interval_days === undefined || !b.use_account_policy, {
        message: 'give rotation_interval_days or use_account_policy, not both',
        path: ['use_account_policy'],
      })
      .refine((b) => b.rotation_interval_days !== undefined || b.use_account_policy || b.profile, {
        message: 'give rotation_interval_days, use_account_policy or profile',
        path: ['rotation_interval_days'],
      }),
    responses: { 200: { description: 'The schedule now in force', schema: Schedule } },
    async handler({ c, user, params, body, meta }) {
      const view = await requireKey(c, user.id, params.fingerprint, meta);
      const schedule = body.use_account_policy
        ? { rotation_mode: 'policy' as const, rotation_interval_days: null }
        : body.rotation_interval_days === null
          ? { rotation_mode: 'off' as const, rotation_interval_days: null }
          : body.rotation_interval_days !== undefined
            ? { rotation_mode: 'interval' as const, rotation_interval_days: body.rotation_interval_days }
            : { rotation_mode: view.lineage.rotation_mode, rotation_interval_days: view.lineage.rotation_interval_days };
      const profile = body.profile ?? view.lineage.profile;
      await setRotationSchedule(c, user.id, view, { ...schedule, profile }, meta);
      const owner = await currentUser(c, user.id);
      const effective =
        schedule.rotation_mode === 'interval' ? schedule.rotation_interval_days : schedule.rotation_mode === 'policy' ? owner.rotation_days : null;
      return {
        body: {
          fingerprint: view.current.fingerprint,
          mode: schedule.rotation_mode,
          rotation_interval_days: schedule.rotation_interval_days,
          profile,
          effective_rotation_interval_days: effective,
          next_rotation_at: effective && !view.lineage.disabled_at ? new Date(view.current.created_at.getTime() + effective * 86400_000).toISOString() : null,
        },
      };
    },
  }),

  route({
    method: 'get',
    path: '/keys/{fingerprint}/rotation-history',
    summary: "Rotation history of a key's lineage, by any generation's fingerprint",
    tags,
    access: 'auth',
    scope: 'keys:read',
    params: KeyParams,
    query: HistoryQuery,
    responses: { 200: { description: 'Newest first', schema: pageOf(RotationEntry) } },
    async handler({ c, user, params, query, meta, reader }) {
      const view = await requireKey(c, user.id, params.fingerprint, meta);
      const { items, total } = await rotationHistory(await reader(), { userId: user.id, lineageId: view.lineage.id, ...query, pageSize: query.page_size });
      return { body: { items: items.map(rotationOut), page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'get',
    path: '/keys/rotation-history',
    summary: 'All rotations of the account, newest first; filter by key (any fingerprint), time, trigger, status',
    tags,
    access: 'auth',
    scope: 'keys:read',
    query: HistoryQuery.extend({ fingerprint: Fingerprint.optional() }),
    responses: { 200: { description: 'Newest first', schema: pageOf(RotationEntry) } },
    async handler({ c, user, query, meta, reader }) {
      if (query.from && query.to && query.from > query.to) throw invalid('validation_failed', '`from` must not be after `to`.');
      const lineageId = query.fingerprint ? (await requireKey(c, user.id, query.fingerprint, meta)).lineage.id : undefined;
      const { items, total } = await rotationHistory(await reader(), { userId: user.id, lineageId, ...query, pageSize: query.page_size });
      return { body: { items: items.map(rotationOut), page: query.page, page_size: query.page_size, total } };
    },
  }),
];
