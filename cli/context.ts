import { Kms } from '../client/index.js';
import { AuthMissingError } from './exit-codes.js';
import { resolveTarget, type Resolved } from './config.js';
import { progressBar } from './progress.js';

export const CLI_VERSION = '0.1.0';

/** The global options every command sees (commander's optsWithGlobals). */
export interface GlobalOptions {
  url?: string;
  json?: boolean;
  quiet?: boolean;
  progress?: boolean;
}

export interface Ctx {
  opts: GlobalOptions;
  kms: Kms;
  target: Resolved;
}

/** The client for a command: the resolved service and credential; `auth` commands fail (exit 3) without one. */
export async function connect(opts: GlobalOptions, { auth = true } = {}): Promise<Ctx> {
  const target = await resolveTarget(opts.url);
  if (auth && !target.token) {
    throw new AuthMissingError(
      target.creds
        ? `The stored login is for ${target.creds.url}, not ${target.url}: run \`kms login\` for it or set KMS_API_KEY.`
        : `Not logged in to ${target.url}: run \`kms login\` or set KMS_API_KEY.`,
    );
  }
  const kms = new Kms({
    url: target.url,
    token: target.token,
    userAgent: `kms-cli/${CLI_VERSION} node/${process.versions.node}`,
    onRetry: ({ attempt, delayMs, reason }) => {
      if (!opts.quiet)
        process.stderr.write(`kms: ${reason.charAt(0).toUpperCase()}${reason.slice(1)}; retrying in ${(delayMs / 1000).toFixed(1)} s (attempt ${attempt}).\n`);
    },
  });
  return { opts, kms, target };
}

/** Progress bars only on a terminal, and never with --json, --quiet or --no-progress. */
export const bars = (opts: GlobalOptions) => progressBar(Boolean(process.stderr.isTTY) && !opts.json && !opts.quiet && opts.progress !== false);

/** Prints a command's answer: JSON with --json, else the human text. */
export function print(opts: GlobalOptions, value: unknown, human?: string | (() => string)): void {
  if (opts.json || human === undefined) process.stdout.write(`${JSON.stringify(value, null, opts.json ? undefined : 2)}\n`);
  else {
    const text = typeof human === 'function' ? human() : human;
    if (text) process.stdout.write(text.endsWith('\n') ? text : `${text}\n`);
  }
}

/** A plain table: one header row, columns padded to their widest cell; the columns are fields the rows' type has. */
export function table<T extends object>(rows: readonly T[], columns: readonly (keyof T & string)[]): string {
  if (!rows.length) return '(none)';
  const cell = (v: unknown): string => {
    if (v === null || v === undefined) return '-';
    if (typeof v === 'string') return v;
    if (typeof v === 'number' || typeof v === 'boolean' || typeof v === 'bigint') return String(v);
    return JSON.stringify(v); // rows are JSON: an object or an array
  };
  const cells = [[...columns], ...rows.map((r) => columns.map((c) => cell(r[c])))];
  const widths = columns.map((_, i) => Math.max(...cells.map((r) => r[i].length)));
  return cells
    .map((r) =>
      r
        .map((v, i) => v.padEnd(widths[i]))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

/** `key: value` lines for an object's fields (`only`: these, fields its type has). */
export function fields<T extends object>(value: T, only?: readonly (keyof T & string)[]): string {
  const entries = Object.entries(value).filter(([k]) => !only || (only as readonly string[]).includes(k));
  const width = Math.max(...entries.map(([k]) => k.length));
  return entries
    .map(([k, v]) => `${k.padEnd(width)}  ${v === null || v === undefined ? '-' : typeof v === 'object' ? JSON.stringify(v) : String(v)}`)
    .join('\n');
}

export function pagedFooter(page: { page: number; page_size: number; total: number }): string {
  const pages = Math.max(1, Math.ceil(page.total / page.page_size));
  return pages > 1 ? `\npage ${page.page} of ${pages} (${page.total} in all; --page N for more)` : '';
}
