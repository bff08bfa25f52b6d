import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * GnuPG and Sequoia (`sq`) for interop tests, each test suite in a private temporary home: the user's
 * keyrings and agent are never touched. gpg runs with `--batch --pinentry-mode loopback`.
 */
/**
 * Random plaintext that gpg compresses by default. gpg leaves an input uncompressed when its first octet
 * reads as the header of an OpenPGP compressed packet (0xa0–0xa3 or 0xc8, ~2 % of random data): the
 * compression tests then failed, or tested the uncompressed case, one run in fifty.
 */
export function plaintextForGpg(size: number): Buffer {
  const data = randomBytes(size);
  data[0] = 0x2a;
  return data;
}

interface ToolResult {
  code: number;
  stdout: Buffer;
  stderr: string;
}

export interface PgpHome {
  dir: string;
  /** Path of a file inside the home (for inputs and outputs). */
  file(name: string): string;
  /** Writes `data` to a file in the home and returns its path. */
  put(name: string, data: string | Uint8Array): Promise<string>;
  /** Runs gpg; rejects on a non-zero exit unless `allowFailure`. `passphrase` goes through a file. */
  gpg(args: string[], opts?: RunOptions & { passphrase?: string }): Promise<ToolResult>;
  /** Runs sq with HOME pointing into the private home. */
  sq(args: string[], opts?: RunOptions): Promise<ToolResult>;
  cleanup(): Promise<void>;
}

interface RunOptions {
  input?: string | Uint8Array;
  allowFailure?: boolean;
}

export async function createPgpHome(): Promise<PgpHome> {
  // Short path: gpg-agent's socket lives here and Unix socket paths are limited to ~108 bytes.
  const dir = await mkdtemp(join(tmpdir(), 'kms-pgp-'));
  const env = { ...process.env, GNUPGHOME: dir, HOME: dir, LC_ALL: 'C' };
  let n = 0;
  const file = (name: string) => join(dir, name);
  const put = async (name: string, data: string | Uint8Array) => {
    await writeFile(file(name), data);
    return file(name);
  };
  return {
    dir,
    file,
    put,
    async gpg(args, opts = {}) {
      const base = ['--homedir', dir, '--batch', '--no-tty', '--yes', '--pinentry-mode', 'loopback', '--trust-model', 'always'];
      if (opts.passphrase !== undefined) base.push('--passphrase-file', await put(`pass-${++n}`, opts.passphrase));
      return run('gpg', [...base, ...args], env, opts);
    },
    sq: (args, opts = {}) => run('sq', args, env, opts),
    async cleanup() {
      spawnSync('gpgconf', ['--homedir', dir, '--kill', 'all'], { env, stdio: 'ignore' });
      await rm(dir, { recursive: true, force: true });
    },
  };
}

function run(cmd: string, args: string[], env: NodeJS.ProcessEnv, opts: RunOptions): Promise<ToolResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env, stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (c: Buffer) => out.push(c));
    child.stderr.on('data', (c: Buffer) => err.push(c));
    child.on('error', reject);
    child.on('close', (code) => {
      const result = { code: code ?? -1, stdout: Buffer.concat(out), stderr: Buffer.concat(err).toString('utf8') };
      if (result.code !== 0 && !opts.allowFailure) {
        reject(new Error(`${cmd} ${args.join(' ')} exited with ${result.code}:\n${result.stderr}`));
      } else resolve(result);
    });
    child.stdin.on('error', () => {}); // the tool may exit before reading all input
    child.stdin.end(opts.input ?? '');
  });
}
