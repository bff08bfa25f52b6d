import { z } from 'zod';
import { route } from '../../route';
import { PageQuery, Timestamp, pageOf, text } from '../../schemas/common';
import { Member } from '../organization/membership';
import { approveLink, endLinkAsSource, rejectLink, linkSource, listLinks, searchSources, teamStatus, unlinkSource } from '../../../lib/teams/team-access';

/**
 * Team access sync (SPEC.md): link to one member of your organization and inherit its keys (encrypt,
 * share, list, public key; decrypt with the key's passphrase), recomputed by the `team-sync` queue.
 * A link grants nothing until its source (or an organization manager above it) approves it: the source
 * lists, approves and ends links under /team-access/links. Reading takes a managed API key with
 * `account:read`; linking, approving and ending need a session.
 */
const tags = ['Team access'];

const Approval = z.enum(['pending', 'approved']);

const Person = z.object({ user_id: z.uuid(), username: z.string(), email: z.string() });

const Link = z
  .object({
    grantee: Person.nullable().describe('The member who inherits (null once its account is gone)'),
    source: Person.nullable().describe('The member whose keys are inherited'),
    approval: Approval,
    requested_at: Timestamp,
    approved_at: Timestamp.nullable(),
    approved_by_user_id: z.uuid().nullable().describe('The source, or the organization manager who approved'),
    state: z.enum(['pending', 'running', 'ok', 'failed']).describe("The grantee's sync state"),
    last_synced_at: Timestamp.nullable(),
  })
  .meta({ id: 'TeamAccessLink' });

const Status = z
  .object({
    linked: z.boolean(),
    state: z.enum(['unlinked', 'pending', 'running', 'ok', 'failed']).describe('pending: a sync is queued; failed: see last_error'),
    source: Person.nullable().describe('The linked source member (null when unlinked or the account is gone)'),
    source_user_id: z.uuid().nullable(),
    linked_at: Timestamp.nullable(),
    approval: Approval.nullable().describe('pending: the source (or an organization manager) has not approved the link yet; it grants nothing'),
    approved_at: Timestamp.nullable(),
    last_synced_at: Timestamp.nullable(),
    last_error: z.string().nullable().describe('`source_unavailable`: the source left the organization or was deleted; `sync_failed`'),
    inherited_keys: z.number().int().describe('Keys inherited right now'),
  })
  .meta({ id: 'TeamAccessStatus' });

export default [
  route({
    method: 'get',
    path: '/team-access/status',
    summary: 'Sync status: linked source, state, last sync, inherited key count, last error',
    tags,
    access: 'auth',
    scope: 'account:read',
    responses: { 200: { description: 'The status', schema: Status } },
    async handler({ c, user }) {
      return { body: await teamStatus(c, user.id) };
    },
  }),

  route({
    method: 'get',
    path: '/team-access/members',
    summary: 'Search eligible source members: live members of your organization other than you, by username or email prefix',
    tags,
    access: 'auth',
    scope: 'account:read',
    query: PageQuery.extend({ q: text(254).optional().describe('Username or email prefix (case-insensitive)') }),
    responses: { 200: { description: 'A page of members', schema: pageOf(Member) } },
    async handler({ c, user, query }) {
      const { items, total } = await searchSources(c, user.id, { prefix: query.q, page: query.page, pageSize: query.page_size });
      return { body: { items, page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'post',
    path: '/team-access/link',
    summary: 'Link (or change) the source member whose keys you inherit; the grants follow from a sync job',
    tags,
    access: 'session',
    // A request a source may approve on trust in the account: made by its owner, not by a stolen session.
    recentSignIn: true,
    body: z.object({ source_user_id: z.uuid().describe('A member id from GET /team-access/members') }),
    responses: { 200: { description: 'The status (state pending until the sync ran)', schema: Status } },
    async handler({ c, user, body, meta }) {
      return { body: await linkSource(c, user.id, body.source_user_id, meta) };
    },
  }),

  route({
    method: 'delete',
    path: '/team-access/link',
    summary: 'Remove the link: every inherited key is revoked at once',
    tags,
    access: 'session',
    responses: {
      200: { description: 'What was unlinked', schema: z.object({ source_user_id: z.uuid(), revoked_keys: z.number().int() }) },
      204: { description: 'Not linked (already unlinked): nothing to do' },
    },
    async handler({ c, user, meta }) {
      const unlinked = await unlinkSource(c, user.id, meta);
      return unlinked ? { body: unlinked } : { status: 204 };
    },
  }),

  route({
    method: 'get',
    path: '/team-access/links',
    summary: 'Links naming you as source, requested and approved (view=organization: every link of your organization, for its owner and admins)',
    tags,
    access: 'auth',
    scope: 'account:read',
    query: PageQuery.extend({ view: z.enum(['source', 'organization']).default('source'), approval: Approval.optional() }),
    responses: { 200: { description: 'A page of links, newest request first', schema: pageOf(Link) } },
    async handler({ c, user, query }) {
      const { items, total } = await listLinks(c, user.id, { view: query.view, approval: query.approval, page: query.page, pageSize: query.page_size });
      return { body: { items, page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'post',
    path: '/team-access/links/{grantee_user_id}/approve',
    summary: "Approve a member's link to your keys (owners and admins: to the keys of a member they outrank); the grants follow from a sync job",
    tags,
    access: 'session',
    // Approving hands another member the source's keys.
    recentSignIn: true,
    params: z.object({ grantee_user_id: z.uuid() }),
    body: z.object({ source_user_id: z.uuid().describe('The source the approval is for: a link changed since is refused (409 `team_link_changed`)') }),
    responses: { 200: { description: 'The approved link', schema: Link } },
    async handler({ c, user, params, body, meta }) {
      return { body: await approveLink(c, user.id, params.grantee_user_id, body.source_user_id, meta) };
    },
  }),

  route({
    method: 'post',
    path: '/team-access/links/{grantee_user_id}/reject',
    summary:
      "Reject a member's pending link to your keys (owners and admins: to the keys of a member they outrank); the request is removed, nothing was granted",
    tags,
    access: 'session',
    params: z.object({ grantee_user_id: z.uuid() }),
    body: z.object({ source_user_id: z.uuid().describe('The source the rejection is for: a link changed since is refused (409 `team_link_changed`)') }),
    responses: {
      200: {
        description: 'The rejected request (an approved link answers 409 `team_link_not_pending`: end it with DELETE)',
        schema: z.object({ grantee_user_id: z.uuid(), source_user_id: z.uuid(), status: z.literal('rejected') }),
      },
    },
    async handler({ c, user, params, body, meta }) {
      return { body: await rejectLink(c, user.id, params.grantee_user_id, body.source_user_id, meta) };
    },
  }),

  route({
    method: 'delete',
    path: '/team-access/links/{grantee_user_id}',
    summary:
      "End a member's link to your keys (requested or approved; or, as owner or admin, one to a member you outrank): its inherited keys are revoked at once",
    tags,
    access: 'session',
    params: z.object({ grantee_user_id: z.uuid() }),
    responses: {
      200: { description: 'What was ended', schema: z.object({ grantee_user_id: z.uuid(), source_user_id: z.uuid(), revoked_keys: z.number().int() }) },
    },
    async handler({ c, user, params, meta }) {
      return { body: await endLinkAsSource(c, user.id, params.grantee_user_id, meta) };
    },
  }),
];
