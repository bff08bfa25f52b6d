import type { Knex } from 'knex';
import { newestFirstPage, type Write } from './knex';
import { rowDigest } from '../lib/audit-chain';
import type { AuditAction } from '../lib/event-names';

/** Who and where a request came from, as audit rows record it. */
export interface RequestMeta {
  ip: string;
  /** The service's own id of the request (never the client's). */
  requestId: string;
  /** The client's X-Request-Id, when it is one the API keeps (api/middleware/request-context.ts). */
  clientRequestId?: string;
}

/**
 * Where an audit row's address and request ids come from: the request (RequestMeta), or a job's origin
 * (the request that enqueued it, nulls for the scheduler). recordAudit copies them into the row.
 */
export type AuditSource = Partial<RequestMeta> | { ip?: string | null; request_id?: string | null; client_request_id?: string | null };

export type AuditStatus = 'success' | 'failure';

export interface AuditEntry {
  user_id: string | null;
  action: AuditAction;
  status: AuditStatus;
  target?: string | null;
  /** Never secrets: ids, names, counts and error codes only. */
  details?: Record<string, unknown>;
}

export interface AuditRow extends Required<Omit<AuditEntry, 'details'>> {
  id: number;
  ip: string | null;
  request_id: string | null;
  client_request_id: string | null;
  details: Record<string, unknown>;
  created_at: Date;
  /** The account's chain (its id at write time, `system` without one): lib/audit-chain.ts. */
  chain: string;
  sequence: number;
  hash: string;
}

/**
 * One audit row's insert, not yet run: a write that lands with the change it records (db/jobs.ts updateJob,
 * db/rotation.ts insertRotation). The row carries its content digest; the audit_logs trigger links it to
 * its account's chain, holding the chain's head until the transaction ends (writers of one account take turns there).
 */
export function auditInsert(db: Knex, entry: AuditEntry, from?: AuditSource): Write {
  const row = { ...entry, ...(from && sourceOf(from)) };
  const details = row.details ?? {};
  const digest = rowDigest({
    action: row.action,
    status: row.status,
    target: row.target ?? null,
    ip: row.ip ?? null,
    request_id: row.request_id ?? null,
    client_request_id: row.client_request_id ?? null,
    details,
  });
  return db<object>('audit_logs').insert({ ...row, details: JSON.stringify(details), digest });
}

/** Writes one audit row (auditInsert); pass the transaction of the change it records so both land or neither. */
export async function recordAudit(db: Knex, entry: AuditEntry, from?: AuditSource): Promise<void> {
  await auditInsert(db, entry, from);
}

/** The row's columns of a source: the one place a request's address and ids become an audit row's. */
function sourceOf(from: AuditSource): { ip: string | null; request_id: string | null; client_request_id: string | null } {
  const requestId = 'requestId' in from ? from.requestId : 'request_id' in from ? from.request_id : undefined;
  const clientRequestId = 'clientRequestId' in from ? from.clientRequestId : 'client_request_id' in from ? from.client_request_id : undefined;
  return { ip: from.ip ?? null, request_id: requestId ?? null, client_request_id: clientRequestId ?? null };
}

/** Whether the account's audit trail records `action` done successfully to `target` (a deleted row's only trace). */
export async function auditedSuccess(db: Knex, userId: string, action: AuditAction, target: string): Promise<boolean> {
  return Boolean(await db('audit_logs').where({ user_id: userId, action, target, status: 'success' }).first('id'));
}

export interface AuditQuery {
  userId: string;
  /** The actions to list (lib/event-names.ts auditActionsMatching): an empty list matches none. */
  actions?: string[];
  status?: AuditStatus;
  page: number;
  pageSize: number;
}

export async function listAudit(db: Knex, q: AuditQuery): Promise<{ items: AuditRow[]; total: number }> {
  const base = db<AuditRow>('audit_logs').where({ user_id: q.userId });
  if (q.actions) base.whereIn('action', q.actions);
  if (q.status) base.andWhere({ status: q.status });
  return newestFirstPage<AuditRow>(base, q);
}

/**
 * Readable labels of audit targets, by target, in one query for a page of rows: a key's label and the end
 * of its fingerprint, an API key's, passkey's or webhook's name, a user's email. Only what the reader may
 * see: their own keys, API keys, passkeys and webhooks, themselves and their organization's members (an
 * access-denied row names another account's resource, whose label stays unknown). A target that is
 * gone, or is none of these, has no label.
 */
export async function targetLabels(db: Knex, readerId: string, targets: string[]): Promise<Map<string, string>> {
  const wanted = [...new Set(targets)];
  if (!wanted.length) return new Map();
  const { rows } = await db.raw<{ rows: { target: string; label: string }[] }>(
    `SELECT k.fingerprint AS target, l.label || ' (' || right(k.fingerprint, 16) || ')' AS label
       FROM pgp_keys k JOIN key_lineages l ON l.id = k.lineage_id WHERE k.fingerprint = ANY(:t) AND k.user_id = :reader
     UNION ALL SELECT id::text, name FROM api_keys WHERE id::text = ANY(:t) AND user_id = :reader
     UNION ALL SELECT id::text, name FROM passkeys WHERE id::text = ANY(:t) AND user_id = :reader
     UNION ALL SELECT id::text, CASE WHEN description <> '' THEN description ELSE url END FROM webhook_endpoints WHERE id::text = ANY(:t) AND user_id = :reader
     UNION ALL SELECT u.id::text, u.email FROM users u WHERE u.id::text = ANY(:t) AND (u.id = :reader OR EXISTS (
       SELECT 1 FROM organization_members me JOIN organization_members them ON them.organization_id = me.organization_id
        WHERE me.user_id = :reader AND them.user_id = u.id))`,
    { t: wanted, reader: readerId },
  );
  return new Map(rows.map((r) => [r.target, r.label]));
}
