import type { MemberRole } from '../../db/teams';

/** Owners and admins manage their organization (invitations, members, team access links). */
export const isManager = (m: { role: MemberRole }) => m.role === 'owner' || m.role === 'admin';

/**
 * Whether a manager of `actor`'s role may act on a member of `target`'s role (remove it, revoke its
 * invitation, decide on links to its keys): the owner on anyone, an admin on plain members only.
 */
export const outranks = (actor: MemberRole, target: MemberRole) => actor === 'owner' || (actor === 'admin' && target === 'member');
