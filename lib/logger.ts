import { pino, type Logger } from 'pino';

export type { Logger };

/**
 * pino JSON logs. Request bodies are never logged; the redaction list is a second line of defence for
 * anything secret that ends up in a logged object by mistake.
 */
const SECRET_KEYS = ['password', 'new_password', 'current_password', 'passphrase', 'token', 'api_key', 'secret', 'authorization', 'cookie'];

export function createLogger(level: string, base: Record<string, unknown> = {}): Logger {
  return pino({
    level,
    base: { pid: process.pid, ...base },
    redact: {
      paths: [...SECRET_KEYS, ...SECRET_KEYS.map((k) => `*.${k}`), 'req.headers.authorization', 'req.headers.cookie'],
      censor: '[redacted]',
    },
    timestamp: pino.stdTimeFunctions.isoTime,
  });
}
