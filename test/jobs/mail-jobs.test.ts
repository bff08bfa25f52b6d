import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { SMTPServer } from 'smtp-server';
import { randomUUID } from 'node:crypto';
import { registerUser, startTestService, type TestService } from '../support/service';
import { startSmtpServer } from '../support/smtp';
import { startWorkers } from '../../workers/worker';
import { notify } from '../../lib/notify';
import { mailAad } from '../../jobs/send-email';
import { sendEmailProcessor } from '../../workers/jobs/send-email';
import { createMailer } from '../../lib/mailer';
import { createLogger } from '../../lib/logger';
import { NO_POOL } from '../../lib/slots';
import { Watchdog } from '../../workers/watchdog';
import type { Job } from 'bullmq';
import type { JobEnvelope } from '../../jobs/define';

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
  const redis = new Redis(s.env.REDIS_URL);
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
    expect(text).toContain(job.data.payload.sealed_email);
    expect(text).not.toContain(u.email);
    await job.remove();
  });

  it('a reset mail holds neither recipient nor token in clear, opens only as its own template and id, and is removed once sent', async () => {
    const u = await registerUser(s.api);
    const token = 'a-reset-token-that-must-not-leak-0000000000';
    await notify(s.c, u.email, 'password-reset', { username: u.username, token, ttl_minutes: '30' });
    const queue = s.c.jobs.queue('notify');
    const [job] = await queue.getJobs(['waiting']);
    expect(job?.name).toBe('send-email');
    const text = await redisText();
    expect(text).toContain(job.data.payload.sealed);
    for (const secret of [u.email, u.username, token]) expect(text).not.toContain(secret);

    const { mail_id, sealed } = job.data.payload as { mail_id: string; sealed: string };
    expect(JSON.parse(s.c.sealer.openText(sealed, mailAad('password-reset', mail_id))).to).toBe(u.email);
    expect(() => s.c.sealer.openText(sealed, mailAad('password-changed', mail_id))).toThrow();
    expect(() => s.c.sealer.openText(sealed, mailAad('password-reset', crypto.randomUUID()))).toThrow();

    const pool = await startWorkers(s.c, [{ queue: 'notify', concurrency: 1 }]);
    try {
      const mail = await smtp.waitFor(u.email);
      expect(mail.text).toContain(`#token=${token}`);
      expect(mail.text).not.toContain('?token=');
      await expect.poll(async () => queue.getJob(job.id!), { timeout: 5000 }).toBeUndefined();
    } finally {
      await pool.close();
    }
  });

  it('forgot-password end to end: the mail carries the token in the fragment, and once sent no job, payload or token is left in Redis', async () => {
    const u = await registerUser(s.api);
    const queue = s.c.jobs.queue('notify');
    const pool = await startWorkers(s.c, [{ queue: 'notify', concurrency: 1 }]);
    try {
      expect((await s.api('POST', '/auth/forgot-password', { body: { email: u.email } })).status).toBe(202);
      const mail = await smtp.waitFor(u.email);
      const token = /#token=([A-Za-z0-9_-]{43})/.exec(mail.text ?? '')?.[1];
      expect(token).toBeDefined();
      expect(mail.text).not.toMatch(/[?&]token=/);
      await expect.poll(async () => Object.values(await queue.getJobCounts()).reduce((a, b) => a + b, 0), { timeout: 5000 }).toBe(0);
      const text = await redisText();
      for (const secret of [u.email, token!, u.username]) expect(text).not.toContain(secret);
    } finally {
      await pool.close();
    }
  });

  it('a sealed message moved to another mail id or template does not open, and the job is given up without retries', async () => {
    const sealed = s.c.sealer.seal(JSON.stringify({ to: 'victim@example.test', vars: { token: 'x' } }), mailAad('password-reset', randomUUID()));
    const ctx = {
      c: s.c,
      job: {} as Job<JobEnvelope>,
      log: createLogger('silent'),
      origin: { request_id: null, ip: null },
      watchdog: new Watchdog({ timeoutMs: 10_000 }),
      slot: NO_POOL,
    };
    for (const template of ['password-reset', 'email-confirm'] as const) {
      await expect(sendEmailProcessor.process({ mail_id: randomUUID(), template, sealed }, ctx)).rejects.toMatchObject({ name: 'UnrecoverableError' });
    }
  });

  it('an SMTP refusal quoting the recipient leaves no address in Redis: a temporary one is retried, a permanent one given up at once', async () => {
    let reply = { code: 451, text: 'try again later' };
    const refusing = new SMTPServer({
      authOptional: true,
      disabledCommands: ['STARTTLS'],
      onRcptTo(address, _session, callback) {
        callback(Object.assign(new Error(`<${address.address}>: ${reply.text}`), { responseCode: reply.code }));
      },
    });
    await new Promise<void>((resolve) => refusing.listen(0, '127.0.0.1', resolve));
    const port = (refusing.server.address() as { port: number }).port;
    const mailer = createMailer({ smtpUrl: `smtp://127.0.0.1:${port}`, from: 'kms@example.test', dir: 'var/mail', log: s.c.log });
    const queue = s.c.jobs.queue('notify');
    const pool = await startWorkers({ ...s.c, mailer }, [{ queue: 'notify', concurrency: 1 }]);
    try {
      const u = await registerUser(s.api);
      await notify(s.c, u.email, 'password-changed', { username: u.username, at: new Date().toISOString() });
      let job: Job | undefined;
      await expect.poll(async () => ([job] = await queue.getJobs(['delayed'])).length, { timeout: 5000 }).toBe(1);
      expect(job!.attemptsMade).toBe(1);
      expect(await redisText()).not.toContain(u.email); // the job's failedReason and stack trace are in Redis
      expect(job!.failedReason).toMatch(/not sent/);
      await job!.remove();

      reply = { code: 550, text: 'no such mailbox' };
      const v = await registerUser(s.api);
      await notify(s.c, v.email, 'password-changed', { username: v.username, at: new Date().toISOString() });
      await expect.poll(async () => Object.values(await queue.getJobCounts()).reduce((a, b) => a + b, 0), { timeout: 5000 }).toBe(0);
      const text = await redisText();
      expect(text).toMatch(/not sent/); // the failure is in the events stream, without the address
      expect(text).not.toContain(v.email);
    } finally {
      await pool.close();
      mailer.close();
      await new Promise<void>((resolve) => refusing.close(() => resolve()));
    }
  });
});
