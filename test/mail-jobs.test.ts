import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { registerUser, startTestService, type TestService } from './support/service';
import { startSmtpServer } from './support/smtp';
import { startWorkers } from '../workers/worker';
import { mailAad } from '../lib/services/notify';

/** Mail jobs carry nothing readable in Redis, open only as what they were made for, and leave when done. */
let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;

beforeAll(async () => {
  smtp = await startSmtpServer();
  s = await startTestService({ roles: ['web'], env: { SMTP_URL: smtp.url } });
});
afterAll(async () => {
  await s?.stop();
  await smtp?.close();
});

/** Every string value under the run's Redis prefix. */
async function redisText(): Promise<string> {
  const redis = new Redis(s.env.REDIS_URL!);
  try {
    const keys = await redis.keys(`*${s.config.redisPrefix}*`);
    const parts: string[] = [];
    for (const key of keys) {
      const type = await redis.type(key);
      if (type === 'hash') parts.push(JSON.stringify(await redis.hgetall(key)));
      else if (type === 'string') parts.push((await redis.get(key)) ?? '');
      else if (type === 'list') parts.push(JSON.stringify(await redis.lrange(key, 0, -1)));
      else if (type === 'stream') parts.push(JSON.stringify(await redis.xrange(key, '-', '+')));
    }
    return parts.join('\n');
  } finally {
    redis.disconnect();
  }
}

describe('a password-reset mail job', () => {
  it('holds neither the recipient nor the token in clear, opens only as its own template and id, and is removed once sent', async () => {
    const u = await registerUser(s.api);
    expect((await s.api('POST', '/auth/forgot-password', { body: { email: u.email } })).status).toBe(202);
    const queue = s.c.jobs.queue('notify');
    const [job] = await queue.getJobs(['waiting']);
    expect(job).toBeDefined();
    const text = await redisText();
    expect(text).toContain(job!.data.payload.sealed);
    expect(text).not.toContain(u.email);
    expect(text).not.toContain(u.username);

    const { mail_id, sealed } = job!.data.payload as { mail_id: string; sealed: string };
    const opened = JSON.parse(s.c.sealer.openText(sealed, mailAad('password-reset', mail_id)));
    expect(opened.to).toBe(u.email);
    expect(opened.vars.token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(text).not.toContain(opened.vars.token);
    expect(() => s.c.sealer.openText(sealed, mailAad('password-changed', mail_id))).toThrow();
    expect(() => s.c.sealer.openText(sealed, mailAad('password-reset', crypto.randomUUID()))).toThrow();

    const pool = await startWorkers(s.c, [{ queue: 'notify', concurrency: 1 }]);
    try {
      const mail = await smtp.waitFor(u.email);
      expect(mail.text).toContain(`#token=${opened.vars.token}`);
      expect(mail.text).not.toContain('?token=');
      await expect.poll(async () => queue.getJob(job!.id!), { timeout: 5000 }).toBeUndefined();
    } finally {
      await pool.close();
    }
  });
});
