import { Writable } from 'node:stream';
import { createLogger, type Logger } from '../../lib/logger';

/**
 * The service's own logger (redaction included) writing into a string a test can read: `logger(level)`
 * makes loggers that all write to the one output.
 */
export function captureLogs(): { logger: (level?: string) => Logger; output: () => string } {
  let out = '';
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      out += chunk.toString();
      done();
    },
  });
  return { logger: (level = 'info') => createLogger(level, {}, sink), output: () => out };
}
