import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { randomUUID } from 'node:crypto';
import nodemailer from 'nodemailer';
import type { Logger } from './logger';

export interface Mail {
  to: string;
  subject: string;
  text: string;
  replyTo?: string;
}

export interface Mailer {
  send(mail: Mail): Promise<{ messageId: string }>;
  close(): void;
}

/**
 * SMTP when SMTP_URL is set. Without it (development), each message is written as an .eml file into
 * MAIL_DIR and its path logged, so a developer can read password-reset links without a mail server.
 */
export function createMailer(opts: { smtpUrl?: string; from: string; dir: string; log: Logger }): Mailer {
  if (opts.smtpUrl) {
    const transport = nodemailer.createTransport(opts.smtpUrl);
    return {
      async send(mail) {
        const info = await transport.sendMail({ from: opts.from, ...mail });
        return { messageId: info.messageId };
      },
      close: () => transport.close(),
    };
  }
  const transport = nodemailer.createTransport({ streamTransport: true, buffer: true, newline: 'unix' });
  const dir = resolve(opts.dir);
  return {
    async send(mail) {
      const info = await transport.sendMail({ from: opts.from, ...mail });
      await mkdir(dir, { recursive: true });
      const file = join(dir, `${new Date().toISOString().replace(/[:.]/g, '-')}-${randomUUID().slice(0, 8)}.eml`);
      await writeFile(file, info.message as Buffer);
      opts.log.info({ file, subject: mail.subject }, 'mail written to folder (no SMTP_URL set)');
      return { messageId: info.messageId };
    },
    close: () => transport.close(),
  };
}
