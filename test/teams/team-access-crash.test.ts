import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Knex } from 'knex';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createKey } from '../support/keys';
import { startSmtpServer } from '../support/smtp';
import { startProcess, waitForOutput } from '../support/process';
import { syncGrants } from '../../lib/teams/team-access';

/**
 * A team-sync worker killed in the middle of a sync (its transaction has deleted a grant and waits to
 * insert another) leaves the last committed grant set; a new worker retries the job and ends at the
 * full new set, the same as any further run.
 */
let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;
const fast = { WORKER_LOCK_MS: '2000', WORKER_STALLED_CHECK_MS: '1000', LOG_LEVEL: 'info' };

beforeAll(async () => {
  smtp = await startSmtpServer();
  s = await startTestService({ roles: ['web'] });
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

const grants = async (granteeId: string) =>
  (await s.c.db('team_grants').where({ grantee_id: granteeId }).orderBy('lineage_id').pluck('lineage_id')) as string[];
const state = async (granteeId: string) => (await s.c.db('team_links').where({ grantee_id: granteeId }).first())?.state as string;

describe('a team-sync worker killed mid-sync', () => {
  it('leaves the last committed grant set, and a new worker completes the sync', async () => {
    const env = { ...s.env, ...fast, SMTP_URL: smtp.url };
    let worker = startProcess('worker', { ...env, WORKER_QUEUES: 'notify=1,team-sync=1' });
    let blocker: Knex.Transaction | undefined;
    try {
      await waitForOutput(worker, 'workers started');
      const owner = await registerUser(s.api);
      const member = await registerUser(s.api);
      expect((await s.api('POST', '/organization/invitations', { token: owner.token, body: { email: member.email } })).status).toBe(201);
      const mail = await smtp.waitFor(member.email);
      const token = /Invitation token: (\S+)/.exec(mail.text ?? '')![1];
      expect((await s.api('POST', '/organization/invitations/accept', { token: member.token, body: { token } })).status).toBe(200);

      const k1 = await createKey(s.api, owner.token, { label: 'k1' });
      const k2 = await createKey(s.api, owner.token, { label: 'k2' });
      expect((await s.api('POST', '/team-access/link', { token: member.token, body: { source_user_id: owner.id } })).status).toBe(200);
      expect((await s.api('POST', `/team-access/links/${member.id}/approve`, { token: owner.token, body: { source_user_id: owner.id } })).status).toBe(200);
      await expect.poll(() => state(member.id), { timeout: 15_000 }).toBe('ok');
      const before = [k1.lineage_id, k2.lineage_id].sort();
      expect(await grants(member.id)).toEqual(before);

      worker.kill('SIGKILL');
      await worker.exited;

      // The source changes its keys while no worker runs: k3 is new, k1 disabled (two syncs queued).
      const k3 = await createKey(s.api, owner.token, { label: 'k3' });
      expect((await s.api('POST', '/keys/disable-key', { token: owner.token, body: { fingerprint: k1.fingerprint } })).status).toBe(200);
      expect(await state(member.id)).toBe('pending');

      // An uncommitted grant of k3 makes the sync's insert wait: the worker is then inside its
      // transaction with k1's grant already deleted.
      blocker = await s.c.db.transaction();
      await blocker('team_grants').insert({ grantee_id: member.id, lineage_id: k3.lineage_id, source_id: owner.id });
      worker = startProcess('worker', { ...env, WORKER_QUEUES: 'team-sync=1' });
      await expect
        .poll(
          async () =>
            Number((await s.c.db.raw(`SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)).rows[0].n),
          { timeout: 20_000, interval: 50 },
        )
        .toBe(1);
      expect(await grants(member.id)).toEqual(before); // nothing of the run is visible
      expect(await state(member.id)).toBe('running');

      worker.kill('SIGKILL');
      await worker.exited;
      await blocker.rollback();
      blocker = undefined;
      // The killed worker's transaction never commits: the last committed set stands.
      expect(await grants(member.id)).toEqual(before);

      worker = startProcess('worker', { ...env, WORKER_QUEUES: 'team-sync=1' });
      const after = [k2.lineage_id, k3.lineage_id].sort();
      await expect.poll(() => grants(member.id), { timeout: 30_000, interval: 100 }).toEqual(after);
      await expect.poll(() => state(member.id), { timeout: 30_000 }).toBe('ok');
      const status = await s.api('GET', '/team-access/status', { token: member.token });
      expect(status.body).toMatchObject({ state: 'ok', inherited_keys: 2, last_error: null });

      // Any further run changes nothing.
      const again = await syncGrants(s.c, member.id, {});
      expect([again.added, again.removed]).toEqual([[], []]);
      expect(await grants(member.id)).toEqual(after);
    } finally {
      await blocker?.rollback().catch(() => undefined);
      worker.kill('SIGKILL');
    }
  }, 120_000);
});
