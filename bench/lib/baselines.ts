import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as NodeReadableStream } from 'node:stream/web';
import * as openpgp from 'openpgp';
import type { PrivateKey, PublicKey } from 'openpgp';
import { generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { MiB, run } from './util';

// ------------------------------------------------------------------------------------------- gpg

const GPG_UID = 'KMS Bench <bench@example.com>';

/** gpg with a fresh ed25519/cv25519 key (no passphrase) in a private homedir. */
export class Gpg {
  private constructor(readonly home: string) {}

  static async create(home: string): Promise<Gpg> {
    await mkdir(home, { mode: 0o700 });
    const gpg = new Gpg(home);
    await gpg.exec(['--passphrase', '', '--quick-gen-key', GPG_UID, 'future-default', 'default', 'never']);
    return gpg;
  }

  /** No compression: the input is random, and the service does not compress by default either. */
  encrypt(input: string, output: string): Promise<void> {
    return this.exec(['--yes', '--trust-model', 'always', '--compress-algo', 'none', '-r', 'bench@example.com', '-o', output, '-e', input]);
  }

  decrypt(input: string, output: string): Promise<void> {
    return this.exec(['--yes', '--passphrase', '', '-o', output, '-d', input]);
  }

  /** Sign and encrypt to its own key, uncompressed (as encrypt). */
  signEncrypt(input: string, output: string): Promise<void> {
    return this.exec([
      '--yes',
      '--passphrase',
      '',
      '--trust-model',
      'always',
      '--compress-algo',
      'none',
      '-u',
      'bench@example.com',
      '-r',
      'bench@example.com',
      '-o',
      output,
      '-se',
      input,
    ]);
  }

  detachSign(input: string, output: string): Promise<void> {
    return this.exec(['--yes', '--passphrase', '', '-u', 'bench@example.com', '-o', output, '--detach-sign', input]);
  }

  verify(signature: string, input: string): Promise<void> {
    return this.exec(['--trust-model', 'always', '--verify', signature, input]);
  }

  /** Ends the gpg-agent this homedir started. */
  close(): Promise<void> {
    return run('gpgconf', ['--homedir', this.home, '--kill', 'gpg-agent']).catch(() => undefined);
  }

  private exec(args: string[]): Promise<void> {
    return run('gpg', ['--homedir', this.home, '--batch', '--quiet', '--pinentry-mode', 'loopback', ...args]);
  }
}

export function gpgVersion(): string {
  try {
    return /gpg \(GnuPG\) (\S+)/.exec(execFileSync('gpg', ['--version'], { encoding: 'utf8' }))?.[1] ?? '?';
  } catch {
    return '?';
  }
}

// ------------------------------------------------------------------------------------ OpenPGP.js

export interface PgpKeys {
  publicKey: PublicKey;
  privateKey: PrivateKey;
}

/** A curve25519 key made by the project's own key code, as the service makes them. */
export async function makePgpKeys(): Promise<PgpKeys> {
  const secret = randomBytes(16).toString('hex');
  const key = await generateKey({ name: 'KMS Bench', email: 'bench@example.com', algorithm: 'curve25519', secret });
  return { publicKey: await readStoredPublicKey(key.publicArmored), privateKey: await unlockPrivateKey(key.privateArmored, secret) };
}

/**
 * The OpenPGP.js baseline: OpenPGP.js itself, streaming file → file in this process the way NOTES.md
 * measured it (web streams in, SEIPDv1 out; decryption with allowUnauthenticatedStream so it streams).
 * Not lib/pgp/stream.ts, which hands the common case to Node's own AES (the thing being compared).
 */
export async function pgpEncrypt(input: string, output: string, keys: PgpKeys): Promise<void> {
  const message = await openpgp.createMessage({ binary: Readable.toWeb(createReadStream(input, { highWaterMark: MiB })) });
  const encrypted = await openpgp.encrypt({
    message,
    encryptionKeys: keys.publicKey,
    format: 'binary',
    config: { preferredCompressionAlgorithm: openpgp.enums.compression.uncompressed },
  });
  await pipeline(Readable.fromWeb(encrypted), createWriteStream(output, { highWaterMark: MiB }));
}

export async function pgpDecrypt(input: string, output: string, keys: PgpKeys): Promise<void> {
  const message = await openpgp.readMessage({ binaryMessage: Readable.toWeb(createReadStream(input, { highWaterMark: MiB })) });
  const { data } = await openpgp.decrypt({ message, decryptionKeys: keys.privateKey, format: 'binary', config: { allowUnauthenticatedStream: true } });
  await pipeline(Readable.fromWeb(data as unknown as NodeReadableStream<Uint8Array>), createWriteStream(output, { highWaterMark: MiB }));
}
