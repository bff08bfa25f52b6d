import { Readable } from 'node:stream';
import { z } from 'zod';
import { route } from '../../route';
import { PageQuery, Timestamp, pageOf, wholeNumber } from '../../schemas/common';
import { auditActions, auditPage } from '../../../lib/audit/audit-log';
import { auditJwks, exportChain, verifyAccountChain } from '../../../lib/audit/audit-evidence';

const EXPORT_CHUNK_LINES = 200;

const Hash = z.string().regex(/^[0-9a-f]{64}$/);

const AuditEntry = z
  .object({
    audit_id: z.number().int(),
    action: z.string(),
    status: z.enum(['success', 'failure']),
    target: z.string().nullable(),
    target_label: z
      .string()
      .nullable()
      .describe(
        "The target in words (a key's label and fingerprint end, an API key's or webhook's name, a user's email); null when it is gone or not the caller's to see",
      ),
    ip: z.string().nullable(),
    request_id: z.string().nullable().describe("The service's id of the request that wrote the row"),
    client_request_id: z.string().nullable().describe('The X-Request-Id the client sent with that request, when it was one the API keeps'),
    details: z.record(z.string(), z.unknown()),
    created_at: Timestamp,
    sequence: z.number().int().describe("The row's place in the account's audit chain (1, 2, …)"),
    hash: Hash.describe("The row's chain hash (docs/audit-evidence.md): GET /audit-logs/export carries what it covers"),
  })
  .meta({ id: 'AuditEntry' });

const Jwks = z
  .object({
    keys: z.array(
      z.object({
        kty: z.literal('OKP'),
        crv: z.literal('Ed25519'),
        x: z.string(),
        kid: z.string(),
        alg: z.literal('EdDSA'),
        use: z.literal('sig'),
        created_at: Timestamp,
        retired_at: Timestamp.nullable().describe('Set once the key signs no more: it stays here so that what it signed still verifies'),
      }),
    ),
  })
  .meta({ id: 'AuditKeys' });

const Verdict = z
  .object({
    ok: z.boolean(),
    chain: z.string().nullable(),
    rows: z.number().int(),
    checkpoints: z.number().int(),
    first_sequence: z.number().int().nullable(),
    last_sequence: z.number().int().nullable(),
    last_checkpoint_sequence: z.number().int().nullable().describe('The newest row a verified signed checkpoint covers'),
    unanchored_rows: z.number().int().describe('Rows after the last checkpoint: protected by the chain alone until the next checkpoint'),
    first_break: z.object({ sequence: z.number().int(), reason: z.string() }).nullable().describe('Where the evidence first breaks, and how'),
  })
  .meta({ id: 'AuditVerdict' });

const AuditActions = z
  .object({ actions: z.array(z.object({ name: z.string().describe('As `action` filters take it'), label: z.string().describe('A short label for people') })) })
  .meta({ id: 'AuditActions' });

export default [
  route({
    method: 'get',
    path: '/audit-logs/actions',
    summary: 'Every audit action, with a short label (docs/events-and-webhooks.md gives the naming rule)',
    tags: ['Audit'],
    access: 'auth',
    scope: 'audit:read',
    responses: { 200: { description: 'The actions, by name', schema: AuditActions } },
    async handler() {
      return { body: { actions: auditActions() } };
    },
  }),

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
        .regex(/^[a-z0-9_.-]+\*?$/, 'an action name such as keys.rotate, or a prefix ending in . or * such as keys. or keys.*')
        .max(64)
        .optional(),
      status: z.enum(['success', 'failure']).optional(),
    }),
    responses: { 200: { description: 'A page of audit entries', schema: pageOf(AuditEntry) } },
    async handler({ user, query, reader }) {
      const { items, total } = await auditPage(await reader(), {
        userId: user.id,
        action: query.action,
        status: query.status,
        page: query.page,
        pageSize: query.page_size,
      });
      return {
        body: {
          items: items.map((r) => ({ ...r, audit_id: r.id, created_at: r.created_at.toISOString() })),
          page: query.page,
          page_size: query.page_size,
          total,
        },
      };
    },
  }),

  route({
    method: 'get',
    path: '/audit-logs/keys',
    summary: 'The public keys that sign audit checkpoints (a JWKS, retired keys included)',
    tags: ['Audit'],
    access: 'public',
    responses: { 200: { description: 'Ed25519 keys as JWKs; `kms audit verify` checks an export with them', schema: Jwks } },
    async handler({ c, ctx }) {
      ctx.set('Cache-Control', 'public, max-age=300');
      return { body: await auditJwks(c) };
    },
  }),

  route({
    method: 'get',
    path: '/audit-logs/export',
    summary: "The account's audit chain with its signed checkpoints, as NDJSON, resumable from a sequence number",
    tags: ['Audit'],
    access: 'auth',
    scope: 'audit:read',
    query: z.object({
      from_sequence: wholeNumber(1, Number.MAX_SAFE_INTEGER)
        .default(1)
        .describe('The first row to send (a resumed export goes on after the last row it received)'),
    }),
    responses: {
      200: {
        description:
          'One JSON object per line: `{"type":"header",…}`, then `{"type":"row",…}` in sequence order with each `{"type":"checkpoint",…}` after the row it covers. Rows after the last checkpoint are protected by the chain alone. docs/audit-evidence.md gives the rule to verify it; `kms audit verify FILE` applies it.',
        schema: z.string(),
        contentType: 'application/x-ndjson',
      },
    },
    async handler({ ctx, user, query, log, reader }) {
      const r = await reader();
      ctx.req.socket.setTimeout(0);
      ctx.status = 200;
      ctx.type = 'application/x-ndjson';
      ctx.set('Cache-Control', 'no-store');
      ctx.set('Content-Disposition', `attachment; filename="audit-${user.id}-${query.from_sequence}.ndjson"`);
      // Pulled a page at a time as the client reads: flat memory whatever the chain's length. Lines
      // leave in chunks of EXPORT_CHUNK_LINES (a write per line would cost more than the line).
      const lines = Readable.from(
        (async function* () {
          let chunk = '';
          let n = 0;
          for await (const line of exportChain(r, user.id, query.from_sequence)) {
            chunk += `${JSON.stringify(line)}\n`;
            if (++n % EXPORT_CHUNK_LINES === 0) {
              yield chunk;
              chunk = '';
            }
          }
          if (chunk) yield chunk;
        })(),
      );
      lines.once('error', (err) => log.warn({ err }, 'audit export ended with an error'));
      ctx.body = lines;
    },
  }),

  route({
    method: 'get',
    path: '/audit-logs/verify',
    summary: "The service's own check of the account's audit chain and checkpoints (the same rule as `kms audit verify`)",
    tags: ['Audit'],
    access: 'auth',
    scope: 'audit:read',
    responses: { 200: { description: 'The verdict, with the first row where the evidence breaks', schema: Verdict } },
    async handler({ c, user, reader }) {
      return { body: await verifyAccountChain(c, user.id, await reader()) };
    },
  }),
];
