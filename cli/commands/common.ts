import { InvalidArgumentError, type Command } from 'commander';
import type { GlobalOptions } from '../context.js';

/**
 * An action with the command's options merged with the global ones (commander passes the positional
 * arguments, then the options, then the command).
 */
export function run<O extends object, A extends unknown[] = []>(fn: (opts: O & GlobalOptions, ...args: A) => Promise<void>) {
  return async (...args: unknown[]) => {
    const cmd = args[args.length - 1] as Command;
    await fn(cmd.optsWithGlobals<O & GlobalOptions>(), ...(args.slice(0, -2) as A));
  };
}

/** Examples appended to a command's --help. */
export const examples = (...lines: string[]) => `\nExamples:\n${lines.map((l) => `  $ ${l}`).join('\n')}\n`;

export const int = (name: string) => (value: string) => {
  const n = Number(value);
  if (!/^-?\d+$/.test(value.trim()) || !Number.isSafeInteger(n)) throw new InvalidArgumentError(`${name} must be an integer.`);
  return n;
};

/** A key fingerprint as the service takes it: 40 hexadecimal digits (a v4 key) or 64 (v6); spaces (as gpg prints them) and case do not matter. */
const fingerprint = (value: string) => {
  const fpr = value.replace(/\s+/g, '').toLowerCase();
  if (!/^(?:[0-9a-f]{40}|[0-9a-f]{64})$/.test(fpr)) throw new InvalidArgumentError('A fingerprint is 40 hexadecimal digits (a v4 key) or 64 (a v6 key).');
  return fpr;
};

/** A job id: a UUID. */
const jobId = (value: string) => {
  if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(value.trim()))
    throw new InvalidArgumentError('A job id is a UUID (as `kms encrypt` and `kms jobs` print it).');
  return value.trim().toLowerCase();
};

/**
 * Checks every `<fingerprint>` and `<job_id>` argument and option of a command tree as commander parses
 * it, so a malformed one is a usage error (exit 2) before any request.
 */
export function checkIds(cmd: Command): void {
  const parsers: Record<string, (value: string) => string> = { fingerprint, job_id: jobId };
  for (const arg of cmd.registeredArguments) {
    const parse = parsers[arg.name()];
    if (parse) arg.argParser(parse);
  }
  for (const opt of cmd.options) {
    const parse = /<(\w+)>/.exec(opt.flags)?.[1];
    if (parse && parsers[parse]) opt.argParser(parsers[parse]);
  }
  cmd.commands.forEach(checkIds);
}
