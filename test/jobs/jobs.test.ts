import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { SMTPServer } from 'smtp-server';
import { startTestService, type TestService } from '../support/service';
import { JobClient } from '../../jobs/client';
import { startWorkers } from '../../workers/worker';
import { mailAad } from '../../jobs/send-email';
import { AppError } from '../../lib/errors';

let s: TestService;
let smtp: SMTPServer;
let smtpPort = 0;
let delivered = 0;

beforeAll(async () => {
  // A slow mail server: each message takes 1.5 s to accept, so a job is still active when we stop.
  smtp = new SMTPServer({
    authOptional: true,
    disabledCommands: ['STARTTLS'],
    onData(stream, _session, callback) {
      stream.resume();
      stream.on('end', () =>
        setTimeout(() => {
          delivered++;
          callback();
        }, 1500),
      );
    },
  });
  await new Promise<void>((resolve) => smtp.listen(0, '127.0.0.1', resolve));
  smtpPort = (smtp.server.address() as { port: number }).port;
  s = await startTestService({ roles: ['web'], env: { SMTP_URL: `smtp://127.0.0.1:${smtpPort}` } });
});
afterAll(async () => {
  await s?.stop();
  await new Promise<void>((resolve) => smtp.close(() => resolve()));
});

/** A send-email payload as notify() makes it. */
const mail = (to: string) => {
  const mail_id = crypto.randomUUID();
  return {
    mail_id,
    template: 'password-changed' as const,
    sealed: s.c.sealer.seal(JSON.stringify({ to, vars: { username: 'x', at: 'now' } }), mailAad('password-changed', mail_id)),
  };
};

describe('job registry', () => {
  it('refuses unknown jobs and payloads that fail their schema', async () => {
    await expect(s.c.jobs.enqueue('no-such-job' as never, {} as never)).rejects.toThrow(/unknown job/);
    await expect(s.c.jobs.enqueue('send-email', { ...mail('a@example.test'), mail_id: 'not a uuid' })).rejects.toThrow();
    await expect(s.c.jobs.enqueue('send-email', mail('a@example.test'), { jobId: 'a:b' })).rejects.toThrow(/must not contain/);
  });

  it('fails loudly (503) when its Redis connection is not ready', async () => {
    const offline = new Redis('redis://127.0.0.1:1', { lazyConnect: true, enableOfflineQueue: false });
    const client = new JobClient(offline, s.config.redisPrefix);
    const err = await client.enqueue('send-email', mail('a@example.test')).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).status).toBe(503);
    offline.disconnect();
  });

  it('refuses to start a worker on an unknown queue', async () => {
    await expect(startWorkers(s.c, [{ queue: 'nope', concurrency: 1 }])).rejects.toThrow(/unknown queue/);
  });
});

describe('worker shutdown', () => {
  it('lets an active job finish before closing', async () => {
    const pool = await startWorkers(s.c, [{ queue: 'notify', concurrency: 1 }]);
    const id = await s.c.jobs.enqueue('send-email', mail('slow@example.test'));
    const queue = s.c.jobs.queue('notify');
    await expect.poll(async () => (await queue.getJob(id))?.processedOn !== undefined, { timeout: 5000, interval: 50 }).toBe(true);
    const before = delivered;
    await pool.close();
    expect(delivered).toBe(before + 1);
    // Sent, and gone from Redis with its sealed recipient and variables.
    expect(await queue.getJob(id)).toBeUndefined();
  });
});
