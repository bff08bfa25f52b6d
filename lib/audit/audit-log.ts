import type { Container } from '../container';
import { listAudit, type AuditQuery } from '../../db/audit';
import { AUDIT_ACTIONS, auditActionsMatching } from '../event-names';

/**
 * A page of the account's audit trail, newest first, by status and by `action`: an exact name or a
 * prefix ending in `.` or `*` (`keys.`, `keys.*`); a legacy name stands for its current one.
 */
export const auditPage = (c: Container, q: Omit<AuditQuery, 'actions'> & { action?: string }) =>
  listAudit(c.db, { ...q, actions: q.action ? auditActionsMatching(q.action) : undefined });

/** Every audit action with its label, by name. */
export const auditActions = () => Object.entries(AUDIT_ACTIONS).map(([name, label]) => ({ name, label }));
