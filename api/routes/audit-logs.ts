import { z } from 'zod';
import { route } from '../route';
import { PageQuery, Timestamp, pageOf } from '../schemas/common';
import { listAudit } from '../../db/audit';

const AuditEntry = z
  .object({
    audit_id: z.number().int(),
    action: z.string(),
    status: z.enum(['success', 'failure']),
    target: z.string().nullable(),
    ip: z.string().nullable(),
    request_id: z.string().nullable(),
    details: z.record(z.string(), z.unknown()),
    created_at: Timestamp,
  })
  .meta({ id: 'AuditEntry' });

export default [
  route({
    method: 'get',
    path: '/audit-logs',
    summary: "The account's audit events, newest first",
    tags: ['Audit'],
    access: 'auth',
    scope: 'audit:read',
    query: PageQuery.extend({
      action: z
        .string()
        .regex(/^[a-z0-9_.-]+\*?$/, 'an action name such as auth.login, or a prefix ending in * such as auth.*')
        .max(64)
        .optional(),
      status: z.enum(['success', 'failure']).optional(),
    }),
    responses: { 200: { description: 'A page of audit entries', schema: pageOf(AuditEntry) } },
    async handler({ c, user, query }) {
      const { items, total } = await listAudit(c.db, { userId: user.id, action: query.action, status: query.status, page: query.page, pageSize: query.page_size });
      return { body: { items: items.map((r) => ({ ...r, audit_id: r.id, created_at: r.created_at.toISOString() })), page: query.page, page_size: query.page_size, total } };
    },
  }),
];
