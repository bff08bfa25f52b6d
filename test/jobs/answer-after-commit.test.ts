import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import pg from 'pg';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createKey } from '../support/keys';

/**
 * A request that has recorded its job answers with it, whatever fails after: here Postgres stops taking
 * the service's connections while a rotation request waits for its job (`Prefer: wait`). The job is
 * recorded and queued and will run: an error answer would make the client ask again, for a second
 * rotation. No worker takes rotations here, so the wait only ends by reading the row, which fails.
 */
let s: TestService;
let admin: pg.Client;
let database: string;

const allowConnections = (allow: boolean) => admin.query(`ALTER DATABASE "${database}" ALLOW_CONNECTIONS ${allow}`);

beforeAll(async () => {
  s = await startTestService({ env: { WORKER_QUEUES: 'crypto=1,notify=1' } });
  database = decodeURIComponent(new URL(s.config.databaseUrl).pathname.slice(1));
  admin = new pg.Client({ connectionString: inject('pgBase') });
  await admin.connect();
});
afterAll(async () => {
  if (admin) {
    await allowConnections(true).catch(() => undefined);
    await admin.end();
  }
  await s?.stop();
});

describe('the answer to a request whose job is recorded', () => {
  it('is 202 with the job, not an error, when reading the job for the answer fails', async () => {
    const u = await registerUser(s.api);
    const key = await createKey(s.api, u.token);
    const answer = s.api('POST', `/keys/${key.fingerprint}/rotate`, { token: u.token, body: {}, headers: { prefer: 'wait=20' } });
    // Once the job is recorded, the service's connections are ended and no new one is allowed.
    await expect.poll(() => jobCount(u.id), { timeout: 10_000, interval: 20 }).toBe(1);
    await allowConnections(false);
    await admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()', [database]);
    const res = await answer;
    await allowConnections(true);
    expect(res.status, JSON.stringify(res.body)).toBe(202);
    expect(res.headers.get('location')).toBe(res.body.status_url);
    const job = await s.api('GET', `/jobs/${res.body.job_id}`, { token: u.token });
    expect(job.status).toBe(200);
    expect([job.body.kind, job.body.state]).toEqual(['rotate-key', 'queued']);
  }, 60_000);
});

/** The account's rotation jobs, read on a connection of its own (the service's are about to be cut). */
async function jobCount(userId: string): Promise<number> {
  const url = new URL(inject('pgBase'));
  url.pathname = `/${database}`;
  const db = new pg.Client({ connectionString: url.toString() });
  await db.connect();
  try {
    return (await db.query(`SELECT 1 FROM jobs WHERE user_id = $1 AND kind = 'rotate-key'`, [userId])).rowCount ?? 0;
  } finally {
    await db.end();
  }
}
