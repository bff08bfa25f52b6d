import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { startTestService, type TestService } from '../support/service';
import { admin, startSoftHsm, type SoftHsm } from '../support/softhsm';
import { loadConfig } from '../../lib/config';
import { createContainer } from '../../lib/container';
import { reseal } from '../../lib/root-of-trust/operations';

/** `npm run admin -- master-key …` leaves one audit row per command on the system chain: ids, never key material. */
let hsm: SoftHsm;
let s: TestService;
const MASTER_KEY = `m1:${randomBytes(32).toString('base64')}`;

beforeAll(async () => {
  hsm = await startSoftHsm();
  s = await startTestService({ roles: [], env: { MASTER_KEY, KEYRING_REFRESH_MS: '200' } });
});
afterAll(async () => {
  await s?.stop();
  await hsm?.stop();
});

const rows = () => s.c.db('audit_logs').where('action', 'like', 'master_keys.%').orderBy('id');

describe('audit rows of the master-key commands', () => {
  it('init, rewrap, a refused rotate, rotate, a refused retire, reseal, retire: one system row each, with the key ids; status none', async () => {
    const root = 'pkcs11:token=kms;object=root-a';
    const withToken = { ...s.env, MASTER_KEY_URI: hsm.uri('root-a') };
    const run = async (args: string[], env = withToken, code = 0) => {
      const out = await admin(['master-key', ...args], env);
      expect(out.code, out.err + out.out).toBe(code);
      return out;
    };

    await run(['init']);
    await run(['init']);
    await run(['rewrap']);
    // No worker takes the maintenance queue here: rotate refuses, and --force goes on with a warning.
    const unserved = await run(['rotate'], withToken, 1);
    expect(unserved.err).toMatch(
      /^no live worker takes the "maintenance" queue on this Redis \(REDIS_PREFIX ".+"\), so the re-seal job would wait and never start/,
    );
    expect(await s.c.db('keyring')).toHaveLength(1);
    const forced = await run(['rotate', '--force']);
    expect(forced.err).toMatch(/^WARNING: no live worker takes the "maintenance" queue/);
    const kid = /Data key (\S+) is current/.exec(forced.out)![1];
    const refused = await run(['retire', 'm1'], withToken, 1);
    expect(refused.err).toMatch(/re-seal to "dk-.*" has not finished/);
    await run(['reseal', '--force']);
    // The re-seal run, as the job does it, once the new key is current everywhere.
    await new Promise((r) => setTimeout(r, 600));
    const c = await createContainer(loadConfig(withToken));
    try {
      expect((await reseal(c.db, c.keyring, c.sealer, kid)).finished_at).not.toBeNull();
    } finally {
      await c.close();
    }
    await run(['retire', 'm1']);
    await run(['reseal']);
    await run(['status']);

    const audit = await rows();
    expect(audit.map((r) => [r.action, r.status, r.target])).toEqual([
      ['master_keys.init', 'success', root],
      ['master_keys.init', 'success', root],
      ['master_keys.rewrap', 'success', root],
      ['master_keys.rotate', 'failure', null],
      ['master_keys.rotate', 'success', kid],
      ['master_keys.retire', 'failure', 'm1'],
      ['master_keys.reseal', 'success', kid],
      ['master_keys.retire', 'success', 'm1'],
      ['master_keys.reseal', 'success', null],
    ]);
    for (const r of audit) expect(r).toMatchObject({ user_id: null, chain: 'system', ip: null, details: { via: 'admin-cli' } });
    expect(audit.map((r) => r.details)).toEqual([
      { via: 'admin-cli', root_id: root, created: true },
      { via: 'admin-cli', root_id: root, created: false },
      { via: 'admin-cli', root_id: root, rewrapped: 1, keys: [{ kid: 'm1', root_id: 'master-key:m1' }] },
      { via: 'admin-cli', refusal: expect.stringMatching(/^no live worker takes the "maintenance" queue/) },
      { via: 'admin-cli', kid, previous_kid: 'm1', root_id: root, current_from: expect.any(String), without_maintenance_worker: true },
      { via: 'admin-cli', kid: 'm1', refusal: expect.stringMatching(/^the re-seal to "dk-.*" has not finished$/) },
      { via: 'admin-cli', enqueued: true, target_kid: kid, resealed: 0, skipped: 0, without_maintenance_worker: true },
      { via: 'admin-cli', kid: 'm1', root_id: root },
      { via: 'admin-cli', enqueued: false },
    ]);
    // Nothing secret: neither the root key nor any wrapped data key is in a row.
    const text = JSON.stringify(audit);
    expect(text).not.toContain(MASTER_KEY.slice(3));
    for (const k of await s.c.db('keyring').whereNotNull('wrapped')) expect(text).not.toContain(k.wrapped.slice(3, 40));
  }, 90_000);
});
