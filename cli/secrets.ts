import { readFileSync } from 'node:fs';
import { UsageError } from './exit-codes.js';

/**
 * The shortest new password or key passphrase the service accepts (its `Password` and `Passphrase`
 * schemas); test/interface/cli.test.ts holds the two together.
 */
export const MIN_SECRET_LENGTH = 12;

/**
 * Reads a secret (passphrase, password, API key) without it ever being in argv (where `ps` and shell
 * history show it): from a file descriptor, then an environment variable, then a prompt without echo
 * on a terminal. A new secret (`confirm`) is held to MIN_SECRET_LENGTH from any source, at a prompt
 * before it is asked a second time.
 */
export async function readSecret(opts: { fd?: string; env: string; prompt: string; what: string; fdFlag: string; confirm?: boolean }): Promise<string> {
  const secret = await readSecretFrom(opts);
  return opts.confirm ? longEnough(secret, opts.what) : secret;
}

async function readSecretFrom(opts: { fd?: string; env: string; prompt: string; what: string; fdFlag: string; confirm?: boolean }): Promise<string> {
  if (opts.fd !== undefined) {
    const fd = Number(opts.fd);
    if (!Number.isInteger(fd) || fd < 0) throw new UsageError(`${opts.fdFlag} needs a file descriptor number.`);
    let text: string;
    try {
      text = readFileSync(fd, 'utf8');
    } catch (err) {
      throw new UsageError(`Cannot read the ${opts.what} from file descriptor ${fd}: ${(err as Error).message}.`);
    }
    return nonEmpty(firstLine(text), opts.what);
  }
  const fromEnv = process.env[opts.env];
  if (fromEnv) return fromEnv;
  if (!process.stdin.isTTY) throw new UsageError(`No ${opts.what}: give ${opts.fdFlag} N or ${opts.env}, or run on a terminal to be asked.`);
  const first = nonEmpty(await promptHidden(opts.prompt), opts.what);
  if (opts.confirm) longEnough(first, opts.what);
  if (opts.confirm && (await promptHidden(`Repeat the ${opts.what}: `)) !== first) throw new UsageError(`The ${opts.what}s do not match.`);
  return first;
}

/** The first line of text (a trailing newline from `echo` or a file is not part of the secret). */
export const firstLine = (text: string) => text.replace(/\r?\n[\s\S]*$/, '');

const nonEmpty = (s: string, what: string) => {
  if (!s) throw new UsageError(`The ${what} is empty.`);
  return s;
};

const longEnough = (s: string, what: string) => {
  if (s.length < MIN_SECRET_LENGTH) throw new UsageError(`The ${what} must be at least ${MIN_SECRET_LENGTH} characters.`);
  return s;
};

/** All of standard input as text. */
export async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/** A line read on the terminal with echo (a username). */
export async function promptLine(question: string): Promise<string> {
  const { createInterface } = await import('node:readline/promises');
  const rl = createInterface({ input: process.stdin, output: process.stderr });
  try {
    return (await rl.question(question)).trim();
  } finally {
    rl.close();
  }
}

/** A line read on the terminal in raw mode, echoing nothing. Ctrl-C ends the program (130). */
export function promptHidden(question: string): Promise<string> {
  const stdin = process.stdin;
  process.stderr.write(question);
  return new Promise((resolve) => {
    let value = '';
    stdin.setRawMode(true);
    stdin.resume();
    stdin.setEncoding('utf8');
    const done = (result: string | null) => {
      stdin.off('data', onData);
      stdin.setRawMode(false);
      stdin.pause();
      process.stderr.write('\n');
      if (result === null) process.exit(130);
      resolve(result);
    };
    const onData = (chunk: string) => {
      for (const ch of chunk) {
        if (ch === '\r' || ch === '\n' || ch === '\u0004') return done(value);
        if (ch === '\u0003') return done(null);
        if (ch === '\u007f' || ch === '\b') value = value.slice(0, -1);
        else if (ch >= ' ') value += ch;
      }
    };
    stdin.on('data', onData);
  });
}
