import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { registerUser, startTestService, type TestService } from '../support/service';
import { startTcpSwitch } from '../support/tcp-switch';

let s: TestService;
let endpoint: Awaited<ReturnType<typeof startTcpSwitch>>;
const pgPort = () => Number(new URL(inject('pgBase')).port || 5432);

beforeAll(async () => {
  // The service reaches Postgres through a switch that can drop every connection, as a failover does.
  endpoint = await startTcpSwitch(pgPort());
  s = await startTestService({ roles: ['web'], dbHost: `127.0.0.1:${endpoint.port}` });
});
afterAll(async () => {
  await s?.stop();
  await endpoint?.close();
});

describe('the audit relay', () => {
  it('announces the rows committed while its session was lost, once it listens again, each once', async () => {
    const u = await registerUser(s.api);
    endpoint.switchTo(pgPort());
    // Committed before the relay listens again (it reconnects after 2 s): no notification reaches it.
    for (let i = 0; i < 3; i++) {
      const login = await s.api('POST', '/auth/login', { body: { identifier: u.username, password: u.password } });
      expect(login.status).toBe(200);
    }
    const rows = (await s.c.db('audit_logs').where({ user_id: u.id }).orderBy('id').pluck('id')).map(Number);
    expect(rows.length).toBeGreaterThanOrEqual(4);
    const announced = async () =>
      ((await s.api('GET', '/events/history?types=audit_logs.recorded&page_size=100', { token: u.token })).body.items as { data: { audit_id: number } }[])
        .map((e) => e.data.audit_id)
        .sort((a, b) => a - b);
    await expect.poll(announced, { timeout: 15_000, interval: 250 }).toEqual(rows);
  });
});
