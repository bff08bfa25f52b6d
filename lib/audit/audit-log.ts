import type { Container } from '../container';
import { listAudit, type AuditQuery } from '../../db/audit';

/** A page of the account's audit trail, newest first (by action, `prefix.*` for a family, and status). */
export const auditPage = (c: Container, q: AuditQuery) => listAudit(c.db, q);
