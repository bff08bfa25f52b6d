/**
 * The `kms` command line end to end against the bench's own client (bench/lib/client.ts: node:http
 * multipart, polling every 100 ms), on one file: upload → job → download, for encrypt and decrypt.
 * The CLI figure includes everything a user waits for: starting node and tsx, reading the login,
 * the upload, `Prefer: wait` / events / polling, and the download. Both download an encryption's
 * ciphertext while it is produced (`?follow=true` from the 103 Early Hints, as the CLI does). Ratio =
 * client time ÷ CLI time (1.0: the CLI is as fast as the bench's client; the target is ≥ 0.9).
 *
 *   npm run bench:cli -- [size]        (default 1G; e.g. 256M)
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Api } from './lib/client';
import { Service } from './lib/service';
import { GiB, formatSize, mibPerSec, parseSize, run, writeRandomFile } from './lib/util';

const BIN = fileURLToPath(new URL('../cli/kms.mjs', import.meta.url));
const size = process.argv[2] && !process.argv[2].startsWith('-') ? parseSize(process.argv[2]) : GiB;
const say = (text: string) => process.stderr.write(`bench:cli ${text}\n`);

/** Runs the CLI to its end; rejects with its stderr on a non-zero exit. Every timed run starts after `sync`, as in the main bench: none pays for the writeback of the one before. */
async function kms(args: string[], env: Record<string, string>): Promise<number> {
  await run('sync', []);
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(performance.now() - started) : reject(new Error(`kms ${args.join(' ')} exited ${code}: ${stderr}`))));
  });
}

/** The bench client's end to end: submit (streamed upload) → poll to completion → download. */
async function clientRun(api: Api, submit: () => ReturnType<Api['submitEncrypt']>, dest: string): Promise<number> {
  await run('sync', []);
  const started = performance.now();
  const { job_id } = await submit();
  const job = await api.waitForJob(job_id, 120_000 * (1 + size / GiB));
  await api.download(job.result!.files![0].download_url, dest);
  return performance.now() - started;
}

/** An encryption as the CLI runs it: the ciphertext downloaded as it is produced, from the 103 Early Hints on. */
async function clientFollowedRun(api: Api, input: string, fingerprint: string, dest: string): Promise<number> {
  await run('sync', []);
  const started = performance.now();
  const { job, downloaded } = await api.submitEncryptFollowed(input, fingerprint, dest);
  await Promise.all([api.waitForJob(job.job_id, 120_000 * (1 + size / GiB)), downloaded]);
  return performance.now() - started;
}

const dir = await mkdtemp(join(tmpdir(), 'kms-bench-cli-'));
const service = new Service(dir, Math.max(2 * size, 8 * GiB));
try {
  say(`writing ${formatSize(size)} of random data`);
  const input = join(dir, 'plain.bin');
  await writeRandomFile(input, size);
  say('starting the service (API + 1 worker)');
  await service.startWeb();
  await service.addWorker('crypto=1,notify=1');

  // The bench's client: its own account and key.
  const api = new Api(service.baseUrl);
  await api.register();
  const passphrase = `bench passphrase ${randomBytes(8).toString('hex')}`;
  const fingerprint = await api.generateKey(passphrase);

  // The CLI: another account, its partner key in KMS_API_KEY, a key made through the CLI itself.
  const id = randomBytes(4).toString('hex');
  const reg = await fetch(`${service.baseUrl}/api/v1/partners/register`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: `bench_cli_${id}`, email: `bench-cli-${id}@example.com`, password: `bench-password-${id}`, company_name: 'KMS bench' }),
  });
  const { partner_api_key } = (await reg.json()) as { partner_api_key: { api_key: string } };
  const home = join(dir, 'home');
  await mkdir(home);
  const env = { HOME: home, XDG_CONFIG_HOME: join(home, 'config'), KMS_URL: service.baseUrl, KMS_API_KEY: partner_api_key.api_key, KMS_PASSPHRASE: passphrase };
  await kms(['keys', 'generate', '--label', 'bench', '--name', 'KMS Bench', '--email', 'bench@example.com', '--json'], env);
  const listed = await fetch(`${service.baseUrl}/api/v1/keys/list`, { headers: { authorization: `Bearer ${partner_api_key.api_key}` } });
  const cliFingerprint = ((await listed.json()) as { items: { fingerprint: string }[] }).items[0].fingerprint;

  say('encrypt: bench client');
  const clientEnc = await clientFollowedRun(api, input, fingerprint, join(dir, 'client.gpg'));
  say('encrypt: kms CLI');
  const cliEnc = await kms(['encrypt', input, '--key', cliFingerprint, '--out', join(dir, 'cli-enc'), '--quiet', '--json'], env);
  say('decrypt: bench client');
  const clientDec = await clientRun(api, () => api.submitDecrypt(join(dir, 'client.gpg'), fingerprint, passphrase), join(dir, 'client.out'));
  say('decrypt: kms CLI');
  const cliDec = await kms(
    ['decrypt', join(dir, 'cli-enc', 'plain.bin.gpg'), '--key', cliFingerprint, '--out', join(dir, 'cli-dec'), '--quiet', '--json'],
    env,
  );

  const line = (what: string, client: number, cli: number) =>
    `${what}: CLI ${(cli / 1000).toFixed(2)} s (${mibPerSec(size, cli).toFixed(0)} MiB/s), bench client ${(client / 1000).toFixed(2)} s (${mibPerSec(size, client).toFixed(0)} MiB/s): CLI ÷ client ${(client / cli).toFixed(2)}`;
  console.log(`CLI end to end vs the bench's client, ${formatSize(size)} random file (ratio = client time ÷ CLI time; 1.0 is parity)`);
  console.log(line('encrypt', clientEnc, cliEnc));
  console.log(line('decrypt', clientDec, cliDec));
  console.log(
    JSON.stringify({
      bench: 'cli',
      bytes: size,
      ms: { client_encrypt: Math.round(clientEnc), cli_encrypt: Math.round(cliEnc), client_decrypt: Math.round(clientDec), cli_decrypt: Math.round(cliDec) },
      ratio: { encrypt: +(clientEnc / cliEnc).toFixed(3), decrypt: +(clientDec / cliDec).toFixed(3) },
    }),
  );
} finally {
  await service.stop();
  await rm(dir, { recursive: true, force: true });
}
