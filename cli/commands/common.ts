import { InvalidArgumentError, type Command } from 'commander';
import type { GlobalOptions } from '../context.js';

/**
 * An action with the command's options merged with the global ones (commander passes the positional
 * arguments, then the options, then the command).
 */
export function run<O extends object, A extends unknown[] = []>(fn: (opts: O & GlobalOptions, ...args: A) => Promise<void>) {
  return async (...args: unknown[]) => {
    const cmd = args[args.length - 1] as Command;
    await fn(cmd.optsWithGlobals() as O & GlobalOptions, ...(args.slice(0, -2) as A));
  };
}

/** Examples appended to a command's --help. */
export const examples = (...lines: string[]) => `\nExamples:\n${lines.map((l) => `  $ ${l}`).join('\n')}\n`;

export const int = (name: string) => (value: string) => {
  const n = Number(value);
  if (!/^-?\d+$/.test(value.trim()) || !Number.isSafeInteger(n)) throw new InvalidArgumentError(`${name} must be an integer`);
  return n;
};
