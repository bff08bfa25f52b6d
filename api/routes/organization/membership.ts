import { z } from 'zod';
import { route } from '../../route';
import { consume } from '../../../lib/auth/limiters';
import { Email, PageQuery, Timestamp, pageOf } from '../../schemas/common';
import {
  INVITATION_STATES,
  acceptInvitation,
  invite,
  listInvitations,
  listMembers,
  lookUpInvitation,
  myOrganization,
  removeMember,
  revokeInvitation,
} from '../../../lib/teams/organizations';

/**
 * Organizations (what team access needs; SPEC.md names no endpoints for them): read the caller's
 * organization and its members, invite by email, list and revoke invitations, accept an invitation,
 * remove a member (or leave).
 * Reading takes a managed API key with `account:read`; changing membership needs a session.
 */
const tags = ['Organizations'];

export const Member = z
  .object({
    user_id: z.uuid(),
    username: z.string(),
    email: z.string(),
    role: z.enum(['owner', 'admin', 'member']),
    joined_at: Timestamp,
  })
  .meta({ id: 'OrganizationMember' });

const Organization = z
  .object({
    organization_id: z.uuid(),
    name: z.string(),
    owner_user_id: z.uuid().nullable(),
    role: z.enum(['owner', 'admin', 'member']).describe("The caller's role"),
    member_count: z.number().int(),
    created_at: Timestamp,
  })
  .meta({ id: 'Organization' });

const Invitation = z
  .object({
    invitation_id: z.uuid(),
    organization_id: z.uuid(),
    email: z.string(),
    role: z.enum(['admin', 'member']),
    state: z.enum(INVITATION_STATES).describe('pending: its token still joins; accepted, revoked and expired ones never do'),
    invited_by_user_id: z.uuid().nullable(),
    expires_at: Timestamp,
    accepted_at: Timestamp.nullable(),
    revoked_at: Timestamp.nullable(),
    created_at: Timestamp,
  })
  .meta({ id: 'OrganizationInvitation' });

const InvitationPreview = z
  .object({
    organization_name: z.string(),
    invited_by: z.object({ username: z.string() }).nullable().describe('Null when the inviting account is gone'),
    email: z.string().describe('The address invited: accept from the account with this address'),
    role: z.enum(['admin', 'member']),
    expires_at: Timestamp,
  })
  .meta({ id: 'OrganizationInvitationPreview' });

export default [
  route({
    method: 'get',
    path: '/organization',
    summary: "The caller's organization (every account has one; it starts as the owner of its own)",
    tags,
    access: 'auth',
    scope: 'account:read',
    responses: { 200: { description: 'The organization and the caller’s role in it', schema: Organization } },
    async handler({ c, user }) {
      return { body: await myOrganization(c, user.id) };
    },
  }),

  route({
    method: 'get',
    path: '/organization/members',
    summary: "Members of the caller's organization, longest-standing first",
    tags,
    access: 'auth',
    scope: 'account:read',
    query: PageQuery,
    responses: { 200: { description: 'A page of members', schema: pageOf(Member) } },
    async handler({ c, user, query }) {
      const { items, total } = await listMembers(c, user.id, { page: query.page, pageSize: query.page_size });
      return { body: { items, page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'post',
    path: '/organization/invitations',
    summary: 'Invite an email address into the organization (owner or admin; admins only by the owner): the token goes by mail, valid 72 hours, once',
    tags,
    access: 'session',
    // An invitation lets another principal into the organization: a stolen session must not hand it out.
    recentSignIn: true,
    body: z.object({ email: Email, role: z.enum(['admin', 'member']).default('member') }),
    responses: { 201: { description: 'The invitation (its token is only in the mail)', schema: Invitation } },
    async handler({ c, user, body, meta }) {
      return { status: 201, body: await invite(c, user, body, meta) };
    },
  }),

  route({
    method: 'get',
    path: '/organization/invitations',
    summary: "The organization's invitations with their expiry and state, newest first (owner or admin)",
    tags,
    access: 'auth',
    scope: 'account:read',
    query: PageQuery.extend({ state: z.enum(INVITATION_STATES).optional() }),
    responses: { 200: { description: 'A page of invitations (never their tokens)', schema: pageOf(Invitation) } },
    async handler({ c, user, query }) {
      const { items, total } = await listInvitations(c, user.id, { state: query.state, page: query.page, pageSize: query.page_size });
      return { body: { items, page: query.page, page_size: query.page_size, total } };
    },
  }),

  route({
    method: 'delete',
    path: '/organization/invitations/{invitation_id}',
    summary: "Revoke an invitation (owner or admin; an admin's invitation only by the owner): its token no longer joins",
    tags,
    access: 'session',
    params: z.object({ invitation_id: z.uuid() }),
    responses: { 204: { description: 'Revoked (or already revoked)' } },
    async handler({ c, user, params, meta }) {
      await revokeInvitation(c, user.id, params.invitation_id, meta);
      return { status: 204 };
    },
  }),

  route({
    method: 'post',
    path: '/organization/invitations/lookup',
    summary:
      'Public: what a pending invitation is (organization, who invited, the address, expiry), by its mailed token in the body (never in a URL); not pending or unknown: 404; rate limited per address',
    tags,
    access: 'public',
    body: z.object({ token: z.string().min(1).max(200) }),
    responses: {
      200: { description: 'The invitation', schema: InvitationPreview },
      404: { description: '`invitation_not_found`: unknown, used, revoked or expired' },
    },
    async handler({ c, body, meta }) {
      await consume(c.limiters.publicIp, `invitation-lookup:${meta.ip}`, 'Too many requests from this address.');
      return { body: await lookUpInvitation(c, body.token) };
    },
  }),

  route({
    method: 'post',
    path: '/organization/invitations/accept',
    summary: "Accept an invitation with the mailed token, signed in as the invited address: the account moves into the inviter's organization",
    tags,
    access: 'session',
    body: z.object({ token: z.string().min(1).max(200) }),
    responses: { 200: { description: 'The organization joined', schema: Organization } },
    async handler({ c, user, body, meta }) {
      return { body: await acceptInvitation(c, user.id, body.token, meta) };
    },
  }),

  route({
    method: 'delete',
    path: '/organization/members/{user_id}',
    summary: 'Remove a member (owner or admin), or leave (your own id); the member gets its own organization back and loses inherited key access',
    tags,
    access: 'session',
    params: z.object({ user_id: z.uuid() }),
    responses: { 204: { description: 'Removed' } },
    async handler({ c, user, params, meta }) {
      await removeMember(c, user.id, params.user_id, meta);
      return { status: 204 };
    },
  }),
];
