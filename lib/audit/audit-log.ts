import type { Container } from '../container';
import { listAudit, targetLabels, type AuditQuery } from '../../db/audit';
import { AUDIT_ACTIONS, auditActionsMatching } from '../event-names';

/**
 * A page of the account's audit trail, newest first, by status and by `action`: an exact name or a
 * prefix ending in `.` or `*` (`keys.`, `keys.*`); a legacy name stands for its current one.
 */
export async function auditPage(c: Container, q: Omit<AuditQuery, 'actions'> & { action?: string }) {
  const page = await listAudit(c.db, { ...q, actions: q.action ? auditActionsMatching(q.action) : undefined });
  // One query for the page's targets, whatever its length.
  const labels = await targetLabels(
    c.db,
    q.userId,
    page.items.flatMap((r) => (r.target ? [r.target] : [])),
  );
  return { ...page, items: page.items.map((r) => ({ ...r, target_label: (r.target && labels.get(r.target)) ?? null })) };
}

/** Every audit action with its label, by name. */
export const auditActions = () => Object.entries(AUDIT_ACTIONS).map(([name, label]) => ({ name, label }));
