import { SMTPServer } from 'smtp-server';
import { simpleParser, type ParsedMail } from 'mailparser';

/** The subject of the mail every registration sends (lib/mail-templates.ts `email-verify`). */
const CONFIRMATION_SUBJECT = 'Confirm your email address';

/**
 * A real SMTP server on loopback that keeps what it receives, for mail round-trip tests. The confirmation
 * each registration sends is kept apart (`confirmations`), so `received` and `waitFor` hold the mail of the
 * flow a test drives; `waitFor(to, { confirmation: true })` waits for a confirmation.
 */
export async function startSmtpServer() {
  const received: ParsedMail[] = [];
  const confirmations: ParsedMail[] = [];
  const waiters: (() => void)[] = [];
  const server = new SMTPServer({
    authOptional: true,
    disabledCommands: ['STARTTLS'],
    onData(stream, _session, callback) {
      simpleParser(stream)
        .then((mail) => {
          (mail.subject === CONFIRMATION_SUBJECT ? confirmations : received).push(mail);
          waiters.splice(0).forEach((w) => w());
          callback();
        })
        .catch(callback);
    },
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.server.address() as { port: number }).port;
  return {
    url: `smtp://127.0.0.1:${port}`,
    received,
    confirmations,
    /** Resolves with the first mail to `to` that arrives (or has arrived) within the timeout. */
    async waitFor(to: string, opts: { timeoutMs?: number; confirmation?: boolean } = {}): Promise<ParsedMail> {
      const timeoutMs = opts.timeoutMs ?? 10_000;
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const found = (opts.confirmation ? confirmations : received).find((m) => m.to && JSON.stringify(m.to).includes(to));
        if (found) return found;
        if (Date.now() > deadline) throw new Error(`no mail to ${to} within ${timeoutMs} ms`);
        await new Promise<void>((resolve) => {
          waiters.push(resolve);
          setTimeout(resolve, 200);
        });
      }
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
