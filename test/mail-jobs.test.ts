import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { registerUser, startTestService, type TestService } from './support/service';
import { startSmtpServer } from './support/smtp';
import { startWorkers } from '../workers/worker';
import { mailAad, notify } from '../lib/services/notify';

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

describe('mail jobs', () => {
  it('forgot-password queues only a sealed address: nothing readable in Redis', async () => {
    const u = await registerUser(s.api);
    expect((await s.api('POST', '/auth/forgot-password', { body: { email: u.email } })).status).toBe(202);
    const [job] = await s.c.jobs.queue('notify').getJobs(['waiting']);
    expect(job?.name).toBe('request-password-reset');
    const text = await redisText();
    expect(text).toContain(job!.data.payload.sealed_email);
    expect(text).not.toContain(u.email);
    await job!.remove();
  });

  it('a reset mail holds neither recipient nor token in clear, opens only as its own template and id, and is removed once sent', async () => {
    const u = await registerUser(s.api);
    const token = 'a-reset-token-that-must-not-leak-0000000000';
    await notify(s.c, u.email, 'password-reset', { username: u.username, token, ttl_minutes: '30' });
    const queue = s.c.jobs.queue('notify');
    const [job] = await queue.getJobs(['waiting']);
    expect(job?.name).toBe('send-email');
    const text = await redisText();
    expect(text).toContain(job!.data.payload.sealed);
    for (const secret of [u.email, u.username, token]) expect(text).not.toContain(secret);

    const { mail_id, sealed } = job!.data.payload as { mail_id: string; sealed: string };
    expect(JSON.parse(s.c.sealer.openText(sealed, mailAad('password-reset', mail_id))).to).toBe(u.email);
    expect(() => s.c.sealer.openText(sealed, mailAad('password-changed', mail_id))).toThrow();
    expect(() => s.c.sealer.openText(sealed, mailAad('password-reset', crypto.randomUUID()))).toThrow();

    const pool = await startWorkers(s.c, [{ queue: 'notify', concurrency: 1 }]);
    try {
      const mail = await smtp.waitFor(u.email);
      expect(mail.text).toContain(`#token=${token}`);
      expect(mail.text).not.toContain('?token=');
      await expect.poll(async () => queue.getJob(job!.id!), { timeout: 5000 }).toBeUndefined();
    } finally {
      await pool.close();
    }
  });
});
