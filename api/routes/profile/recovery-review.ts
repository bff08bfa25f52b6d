import { z } from 'zod';
import { route } from '../../route';
import { PageQuery, Timestamp, pageOf } from '../../schemas/common';
import { REVIEW_ACTIONS, REVIEW_KINDS, REVIEW_OUTCOMES, decideReviewItem, listReviewItems } from '../../../lib/accounts/recovery-review';

/**
 * Review after recovery (lib/accounts/recovery-review.ts): what a password reset undid of the access the
 * account gave others shortly before it, each item kept (restored) or removed by the owner, once. Reading
 * and deciding need a session (a reset ended every API key); deciding needs a recent sign-in.
 */
const tags = ['Profile'];

const ReviewItem = z
  .object({
    item_id: z.uuid(),
    kind: z.enum(REVIEW_KINDS).describe('invitation: an organization invitation; team_link: a team access link (target_id is its grantee); webhook; member'),
    target_id: z.uuid().describe('The invitation, grantee, webhook endpoint or member the item is about'),
    label: z.string().describe('What it is, for a person: an email address, a webhook receiver’s host'),
    action: z
      .enum(REVIEW_ACTIONS)
      .describe(
        'What the reset did: revoked (an open invitation), returned_to_pending (a team link’s approval withdrawn, its inherited keys with it), paused (a webhook endpoint turned off), demoted (an admin made a plain member), listed (a member who joined in that time; nothing changed)',
      ),
    done_at: Timestamp.describe('When the reset did it'),
    decision: z.enum(['kept', 'removed']).nullable().describe('null while open'),
    decided_at: Timestamp.nullable(),
  })
  .meta({ id: 'RecoveryReviewItem' });

const Decided = ReviewItem.extend({
  outcome: z
    .enum(REVIEW_OUTCOMES)
    .describe(
      'reopened (the invitation’s token joins again), restored (the link approved again, the admin an admin again), resumed (the webhook receives events again), unchanged (nothing was left to restore: already so), removed (ended or deleted; an invitation stays revoked), already_gone',
    ),
}).meta({ id: 'RecoveryReviewDecision' });

const Params = z.object({ item_id: z.uuid() });

const decide = (decision: 'kept' | 'removed', path: string, summary: string) =>
  route({
    method: 'post',
    path,
    summary,
    tags,
    access: 'session',
    // Keeping gives access again, and the review must be the owner's: a session signed in just now.
    recentSignIn: true,
    params: Params,
    responses: { 200: { description: 'The decided item and what deciding did', schema: Decided } },
    async handler({ c, user, params, meta }) {
      return { body: await decideReviewItem(c, user.id, params.item_id, decision, meta) };
    },
  });

export default [
  route({
    method: 'get',
    path: '/profile/recovery-review',
    summary: 'What password resets undid of the access given to others in the RECOVERY_REVIEW_DAYS before them, newest first',
    tags,
    access: 'session',
    query: PageQuery.extend({ state: z.enum(['open', 'kept', 'removed']).optional().describe('open: not decided yet') }),
    responses: { 200: { description: 'A page of review items', schema: pageOf(ReviewItem) } },
    async handler({ c, user, query }) {
      const { items, total } = await listReviewItems(c, user.id, { state: query.state, page: query.page, pageSize: query.page_size });
      return { body: { items, page: query.page, page_size: query.page_size, total } };
    },
  }),
  decide(
    'kept',
    '/profile/recovery-review/{item_id}/keep',
    'Keep one item: restore what the reset undid (reopen the invitation, approve the link again, resume the webhook, make the member an admin again)',
  ),
  decide(
    'removed',
    '/profile/recovery-review/{item_id}/remove',
    'Remove one item: end the link, delete the webhook, remove the member from the organization (an invitation stays revoked)',
  ),
];
