import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { recordAudit } from '../../db/audit';
import { checkpointChains, exportChain } from '../../lib/audit/audit-evidence';
import type { AuditAction } from '../../lib/event-names';
import * as m035 from '../../db/migrations/035_action_names';

/**
 * Audit actions and event types take one scheme (docs/events-and-webhooks.md, "Names"). Rows written
 * under the legacy names are renamed by migration 035 without breaking their chain or its signed
 * checkpoints; filters take exact names, prefixes and legacy names.
 */
let s: TestService;
beforeAll(async () => {
  s = await startTestService();
});
afterAll(async () => {
  await s?.stop();
});

type Page = { items: { action: string; target: string | null }[]; total: number };
const actionsOf = async (token: string, filter: string) =>
  ((await s.api('GET', `/audit-logs?action=${encodeURIComponent(filter)}&page_size=100`, { token })).body as Page).items.map((r) => r.action);

describe('migration 035 on a database with legacy-named rows', () => {
  it('renames them, keeps the chain and its checkpoints verifying, and filters by the new, prefixed and legacy names', async () => {
    const u = await registerUser(s.api);
    // Rows written the way the code wrote them before 035 (the digest of the legacy name), and a signed checkpoint of them.
    const legacy = ['keys.rotation_schedule', 'api_key.created', 'api_key.revoked', 'team_access.linked'];
    for (const [i, action] of legacy.entries())
      await recordAudit(s.c.db, { user_id: u.id, action: action as AuditAction, status: 'success', target: `t${i}`, details: { i } });
    expect((await checkpointChains(s.c)).signed).toBeGreaterThan(0);
    // The database as it was before 035 (down leaves these rows as they are: none was renamed yet).
    await m035.down(s.c.db);
    const before = await s.c.db('audit_logs').where({ chain: u.id }).orderBy('sequence').select('sequence', 'digest', 'hash');

    await m035.up(s.c.db);

    const after = await s.c.db('audit_logs').where({ chain: u.id }).orderBy('sequence').select('sequence', 'digest', 'hash', 'action', 'recorded_action');
    expect(after.map(({ sequence, digest, hash }) => ({ sequence, digest, hash }))).toEqual(before);
    expect(after.filter((r) => r.recorded_action !== null).map((r) => [r.recorded_action, r.action])).toEqual([
      ['keys.rotation_schedule', 'keys.schedule_rotation'],
      ['api_key.created', 'api_keys.create'],
      ['api_key.revoked', 'api_keys.revoke'],
      ['team_access.linked', 'team_links.link'],
    ]);

    const verdict = await s.api('GET', '/audit-logs/verify', { token: u.token });
    expect(verdict.body).toMatchObject({ ok: true, first_break: null, rows: after.length });
    expect(verdict.body.checkpoints).toBeGreaterThan(0);
    // The export carries what the digest covers, and the current name beside it.
    const lines = [];
    for await (const line of exportChain(s.c, u.id, 1)) lines.push(line);
    expect(lines.find((l) => l.type === 'row' && l.action === 'api_key.created')).toMatchObject({ renamed_to: 'api_keys.create' });
    expect(lines.find((l) => l.type === 'row' && l.action === 'partners.register')).not.toHaveProperty('renamed_to');

    expect(await actionsOf(u.token, 'keys.schedule_rotation')).toEqual(['keys.schedule_rotation']);
    expect(await actionsOf(u.token, 'keys.rotation_schedule')).toEqual(['keys.schedule_rotation']);
    expect((await actionsOf(u.token, 'api_keys.')).sort()).toEqual(['api_keys.create', 'api_keys.revoke']);
    expect((await actionsOf(u.token, 'api_keys.*')).sort()).toEqual(['api_keys.create', 'api_keys.revoke']);
    expect((await actionsOf(u.token, 'api_key.*')).sort()).toEqual(['api_keys.create', 'api_keys.revoke']);
    expect(await actionsOf(u.token, 'api_key.created')).toEqual(['api_keys.create']);
    expect(await actionsOf(u.token, 'team_links.*')).toEqual(['team_links.link']);
    expect(await actionsOf(u.token, 'nothing.')).toEqual([]);
    expect(await actionsOf(u.token, 'api_keys')).toEqual([]);
  });
});

describe('GET /audit-logs/actions', () => {
  it('lists every action with a label, in the one scheme', async () => {
    const u = await registerUser(s.api);
    const res = await s.api('GET', '/audit-logs/actions', { token: u.token });
    expect(res.status).toBe(200);
    const items = res.body.actions as { name: string; label: string }[];
    expect(items).toContainEqual({ name: 'keys.rotate', label: 'Key rotated' });
    for (const { name, label } of items) {
      expect(name).toMatch(/^[a-z_]+s\.[a-z_]+$/);
      expect(label.length).toBeGreaterThan(0);
    }
    expect((await s.api('GET', '/audit-logs/actions')).status).toBe(401);
  });
});

describe('target_label', () => {
  it("labels the page's targets the caller may see, null for another account's and for one that is gone", async () => {
    const u = await registerUser(s.api);
    const other = await registerUser(s.api);
    const hook = await s.api('POST', '/webhooks', { token: u.token, body: { url: 'http://127.0.0.1:9/labelled', event_types: ['keys.expired'] } });
    const gone = await s.api('POST', '/webhooks', { token: u.token, body: { url: 'http://127.0.0.1:9/gone', description: 'Gone soon' } });
    expect((await s.api('DELETE', `/webhooks/${gone.body.webhook_id}`, { token: u.token })).status).toBe(204);
    await recordAudit(s.c.db, { user_id: u.id, action: 'keys.deny_access', status: 'failure', target: other.id });
    const items = (await s.api('GET', '/audit-logs?page_size=100', { token: u.token })).body.items as {
      action: string;
      target: string;
      target_label: string | null;
    }[];
    const label = (action: string, target: string) => items.find((r) => r.action === action && r.target === target)?.target_label;
    expect(label('partners.register', u.id)).toBe(u.email);
    expect(label('webhooks.create', hook.body.webhook_id)).toBe('http://127.0.0.1:9/labelled');
    expect(label('webhooks.create', gone.body.webhook_id)).toBeNull();
    expect(label('webhooks.delete', gone.body.webhook_id)).toBeNull();
    expect(label('keys.deny_access', other.id)).toBeNull();
  });
});

describe('legacy event type names on input', () => {
  it('a webhook filter and an event filter read a legacy name as the current one; an unknown name is refused', async () => {
    const u = await registerUser(s.api);
    const hook = await s.api('POST', '/webhooks', {
      token: u.token,
      body: { url: 'http://127.0.0.1:9/legacy', event_types: ['key.rotated', 'keys.rotated', 'job.failed'] },
    });
    expect(hook.status, JSON.stringify(hook.body)).toBe(201);
    expect(hook.body.event_types).toEqual(['keys.rotated', 'jobs.failed']);
    const unknown = await s.api('POST', '/webhooks', { token: u.token, body: { url: 'http://127.0.0.1:9/unknown', event_types: ['key.exploded'] } });
    expect(unknown.status).toBe(422);
    const history = await s.api('GET', '/events/history?types=key.generated', { token: u.token });
    expect(history.status).toBe(200);
    expect((await s.api('GET', '/events/history?types=key.exploded', { token: u.token })).status).toBe(422);
  });
});
