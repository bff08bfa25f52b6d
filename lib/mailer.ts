import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { randomUUID } from 'node:crypto';
import type { Transporter } from 'nodemailer';
import type { Logger } from './logger';

interface Mail {
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
 * nodemailer is loaded, and its transport made, at the first message: only the notify worker sends mail,
 * and every other process would carry its ~100 modules through each of its garbage collections.
 */
export function createMailer(opts: { smtpUrl?: string; from: string; dir: string; log: Logger }): Mailer {
  let transport: Promise<Transporter> | undefined;
  const open = () =>
    (transport ??= import('nodemailer').then(({ default: nodemailer }) =>
      opts.smtpUrl ? nodemailer.createTransport(opts.smtpUrl) : nodemailer.createTransport({ streamTransport: true, buffer: true, newline: 'unix' }),
    ));
  const dir = resolve(opts.dir);
  return {
    async send(mail) {
      const info = (await (await open()).sendMail({ from: opts.from, ...mail })) as { messageId: string; message?: Buffer };
      if (!opts.smtpUrl) {
        await mkdir(dir, { recursive: true });
        const file = join(dir, `${new Date().toISOString().replace(/[:.]/g, '-')}-${randomUUID().slice(0, 8)}.eml`);
        await writeFile(file, info.message!);
        opts.log.info({ file, subject: mail.subject }, 'mail written to folder (no SMTP_URL set)');
      }
      return { messageId: info.messageId };
    },
    close: () => void transport?.then((t) => t.close()),
  };
}
