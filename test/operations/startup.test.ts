import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { startTestService, type TestService } from '../support/service';
import { startProcess, waitForOutput } from '../support/process';

/** What `npm start` tells the person who ran it: where to go, what is unsafe, and what stopped it. */
let s: TestService;

beforeAll(async () => {
  s = await startTestService({ roles: ['web'] });
});
afterAll(async () => {
  await s?.stop();
});

const records = (output: string) =>
  output
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as Record<string, unknown>);

describe('start-up', () => {
  it('logs the API and console URLs once, and warns once of the public development secrets, as JSON records off a terminal', async () => {
    const web = startProcess('web', { ...s.env, LOG_LEVEL: 'info' });
    try {
      await waitForOutput(web, 'console');
      await waitForOutput(web, 'JWT_SECRET');
      const all = records(web.output());
      const port = Number(all.find((r) => r.msg === 'api listening')?.port);
      expect(port).toBeGreaterThan(0);
      const ready = all.filter((r) => typeof r.msg === 'string' && r.msg.includes('console'));
      expect(ready).toHaveLength(1);
      expect(ready[0]).toMatchObject({ level: 30, api_url: `http://localhost:${port}/api/v1`, console_url: `http://localhost:${port}/` });
      const warnings = all.filter((r) => typeof r.msg === 'string' && r.msg.includes('development'));
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toMatchObject({ level: 40, settings: ['MASTER_KEY', 'JWT_SECRET'] });
      expect(warnings[0].msg).toMatch(/MASTER_KEY and JWT_SECRET/);
    } finally {
      web.kill('SIGKILL');
      await web.exited;
    }
  }, 30_000);

  it('ends with one line naming REDIS_URL when Redis cannot be reached', async () => {
    const web = startProcess('web', { ...s.env, REDIS_URL: 'redis://127.0.0.1:1' });
    expect(await web.exited).not.toBe(0);
    const lines = web.output().trim().split('\n');
    expect(lines, web.output()).toHaveLength(1);
    expect(lines[0]).toMatch(/^REDIS_URL: .*127\.0\.0\.1:1.*ECONNREFUSED/);
  }, 30_000);

  it('ends with one line naming DATABASE_URL when Postgres cannot be reached, without its password', async () => {
    const db = new URL(inject('pgBase'));
    db.host = '127.0.0.1:1';
    db.password = 'hunter2-secret';
    db.pathname = '/kms';
    const web = startProcess('web', { ...s.env, DATABASE_URL: db.toString() });
    expect(await web.exited).not.toBe(0);
    const lines = web.output().trim().split('\n');
    expect(lines, web.output()).toHaveLength(1);
    expect(lines[0]).toMatch(/^DATABASE_URL: .*127\.0\.0\.1:1.*ECONNREFUSED/);
    expect(lines[0]).not.toContain('hunter2');
  }, 30_000);
});
