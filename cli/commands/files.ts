import { readFile, stat } from 'node:fs/promises';
import type { Command } from 'commander';
import { decryptFiles, encryptFiles, rewrap, signFiles, verifyFiles, type FileJobResult } from '../../client/index.js';
import { bars, connect, print, table, type GlobalOptions } from '../context.js';
import { EXIT, UsageError } from '../exit-codes.js';
import { readSecret } from '../secrets.js';
import { examples, run } from './common.js';

interface Common {
  out?: string;
  force?: boolean;
  idempotencyKey?: string;
  download: boolean;
}

const common = (cmd: Command) =>
  cmd
    .option('-o, --out <dir>', 'folder for the outputs (created if missing)', '.')
    .option('-f, --force', 'replace output files that exist')
    .option('--idempotency-key <key>', 'send this Idempotency-Key (default: a new one; every retry of this run reuses it)')
    .option('--no-download', 'leave the outputs on the service (download later with `kms jobs download`)');

const size = (n: number) => (n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${n} B`);

function report(opts: GlobalOptions, verb: string, result: FileJobResult) {
  print(opts, { job: result.job, outputs: result.outputs }, () =>
    result.outputs.length
      ? `${verb} ${result.outputs.length} file(s) (job ${result.job.job_id}):\n${table(
          result.outputs.map((o) => ({ file: o.path, size: size(o.size) })),
          ['file', 'size'],
        )}`
      : `${verb}: job ${result.job.job_id} ${result.job.state}; outputs stay on the service until ${result.job.expires_at ?? 'their retention ends'}`,
  );
}

async function checkFiles(files: string[]) {
  for (const f of files) {
    const info = await stat(f).catch(() => undefined);
    if (!info?.isFile()) throw new UsageError(`${f} is not a readable file.`);
  }
}

/** Runs a file job with a progress bar that is always taken down, even when the job fails. */
async function withBar<T>(
  opts: GlobalOptions,
  fn: (onProgress: ReturnType<typeof bars>['onProgress'], onSubmitted: (job: { job_id: string }) => void) => Promise<T>,
): Promise<T> {
  const bar = bars(opts);
  const onSubmitted = (job: { job_id: string }) => {
    // The upload is over: its bar ends before the job's id gets a line of its own.
    bar.stop();
    if (!opts.quiet && !opts.json && process.stderr.isTTY) process.stderr.write(`job ${job.job_id}\n`);
  };
  try {
    return await fn(bar.onProgress, onSubmitted);
  } finally {
    bar.stop();
  }
}

export function registerFiles(program: Command) {
  common(
    program
      .command('encrypt <files...>')
      .description(
        'Encrypt files to a stored key or a public key: upload, and download each ciphertext while the job produces it (kept once the job has completed)',
      )
      .option('-k, --key <fingerprint>', 'a key of yours (any generation: the current one is used)')
      .option('--public-key <file>', 'an armored OpenPGP public key file (e.g. exported from gpg)')
      .option('-a, --armor', 'ASCII-armored output (.asc) instead of binary (.gpg)')
      .option('--compress', 'compress before encrypting')
      .option('--sign-with <fingerprint>', 'sign too, with this key of yours (its passphrase from --passphrase-fd, KMS_PASSPHRASE or a prompt)')
      .option('--passphrase-fd <n>', "read --sign-with's passphrase from this file descriptor"),
  )
    .addHelpText(
      'after',
      examples(
        'kms encrypt report.pdf data.csv --key 8F3A… --out encrypted/',
        'kms encrypt notes.txt --public-key bob.asc --armor',
        'kms encrypt big.tar --key 8F3A… --json > result.json',
      ),
    )
    .action(
      run<Common & { key?: string; publicKey?: string; armor?: boolean; compress?: boolean; signWith?: string; passphraseFd?: string }, [string[]]>(
        async (opts, files) => {
          if (Boolean(opts.key) === Boolean(opts.publicKey)) throw new UsageError('Give exactly one of --key FINGERPRINT and --public-key FILE.');
          await checkFiles(files);
          const publicKey = opts.publicKey
            ? await readFile(opts.publicKey, 'utf8').catch(() => Promise.reject(new UsageError(`Cannot read ${opts.publicKey}.`)))
            : undefined;
          const { kms } = await connect(opts);
          const signWith = opts.signWith
            ? {
                fingerprint: opts.signWith,
                passphrase: await readSecret({
                  fd: opts.passphraseFd,
                  env: 'KMS_PASSPHRASE',
                  prompt: 'Signing key passphrase: ',
                  what: 'passphrase',
                  fdFlag: '--passphrase-fd',
                }),
              }
            : undefined;
          const result = await withBar(opts, (onProgress, onSubmitted) =>
            encryptFiles(kms, {
              files,
              fingerprint: opts.key,
              publicKey,
              armor: opts.armor,
              compress: opts.compress,
              signWith,
              outDir: opts.out,
              overwrite: opts.force,
              idempotencyKey: opts.idempotencyKey,
              noDownload: !opts.download,
              onProgress,
              onSubmitted,
            }),
          );
          report(opts, 'encrypted', result);
        },
      ),
    );

  common(
    program
      .command('decrypt <files...>')
      .description('Decrypt files with a stored key and its passphrase: upload, wait, download the plaintext')
      .requiredOption('-k, --key <fingerprint>', "the key (any generation's fingerprint)")
      .option('--passphrase-fd <n>', 'read the passphrase from this file descriptor')
      .option('--verify-with <fingerprint>', 'verify the signatures inside with this stored key (the job result lists each file’s verdict)')
      .option('--require-signature', 'with --verify-with: a file without a valid signature fails (no plaintext is kept)'),
  )
    .addHelpText(
      'after',
      examples(
        'kms decrypt encrypted/*.gpg --key 8F3A… --out plain/',
        'KMS_PASSPHRASE=… kms decrypt report.pdf.gpg --key 8F3A…',
        'kms decrypt x.gpg --key 8F3A… --passphrase-fd 3 3<pass.txt',
      ) + '\nThe passphrase comes from --passphrase-fd N, else KMS_PASSPHRASE, else a prompt without echo.\n',
    )
    .action(
      run<Common & { key: string; passphraseFd?: string; verifyWith?: string; requireSignature?: boolean }, [string[]]>(async (opts, files) => {
        if (opts.requireSignature && !opts.verifyWith) throw new UsageError('--require-signature needs --verify-with FINGERPRINT');
        await checkFiles(files);
        const { kms } = await connect(opts);
        const passphrase = await readSecret({
          fd: opts.passphraseFd,
          env: 'KMS_PASSPHRASE',
          prompt: 'Key passphrase: ',
          what: 'passphrase',
          fdFlag: '--passphrase-fd',
        });
        const result = await withBar(opts, (onProgress, onSubmitted) =>
          decryptFiles(kms, {
            files,
            fingerprint: opts.key,
            passphrase,
            verifyWith: opts.verifyWith,
            requireSignature: opts.requireSignature,
            outDir: opts.out,
            overwrite: opts.force,
            idempotencyKey: opts.idempotencyKey,
            noDownload: !opts.download,
            onProgress,
            onSubmitted,
          }),
        );
        report(opts, 'decrypted', result);
      }),
    );

  common(
    program
      .command('sign <files...>')
      .description("Sign files with a stored key's current generation: detached signatures (.sig, .asc armored) or signed messages")
      .requiredOption('-k, --key <fingerprint>', "the key (any generation's fingerprint)")
      .option('-a, --armor', 'ASCII-armored output (.asc)')
      .option('--inline', 'signed messages holding the files instead of detached signatures')
      .option('--passphrase-fd <n>', 'read the passphrase from this file descriptor'),
  )
    .addHelpText(
      'after',
      examples('kms sign report.pdf --key 8F3A…', 'KMS_PASSPHRASE=… kms sign data.csv --key 8F3A… --armor --out signatures/') +
        '\nThe passphrase comes from --passphrase-fd N, else KMS_PASSPHRASE, else a prompt without echo.\n',
    )
    .action(
      run<Common & { key: string; armor?: boolean; inline?: boolean; passphraseFd?: string }, [string[]]>(async (opts, files) => {
        await checkFiles(files);
        const { kms } = await connect(opts);
        const passphrase = await readSecret({
          fd: opts.passphraseFd,
          env: 'KMS_PASSPHRASE',
          prompt: 'Key passphrase: ',
          what: 'passphrase',
          fdFlag: '--passphrase-fd',
        });
        const result = await withBar(opts, (onProgress, onSubmitted) =>
          signFiles(kms, {
            files,
            fingerprint: opts.key,
            passphrase,
            detached: !opts.inline,
            armor: opts.armor,
            outDir: opts.out,
            overwrite: opts.force,
            idempotencyKey: opts.idempotencyKey,
            noDownload: !opts.download,
            onProgress,
            onSubmitted,
          }),
        );
        report(opts, 'signed', result);
      }),
    );

  program
    .command('verify <files...>')
    .description('Verify signatures: detached ones (--signature, one per file, same order) or signed messages; exits 1 unless every file has a valid signature')
    .option('-k, --key <fingerprint>', 'a stored key (any of its generations may have signed)')
    .option('--public-key <file>', "the signer's armored OpenPGP public key file")
    .option(
      '-s, --signature <file>',
      'a detached signature (.sig or .asc), repeatable: one per file',
      (v: string, all: string[]) => [...all, v],
      [] as string[],
    )
    .addHelpText('after', examples('kms verify report.pdf --key 8F3A… --signature report.pdf.sig', 'kms verify signed.gpg --public-key partner.asc --json'))
    .action(
      run<{ key?: string; publicKey?: string; signature: string[] }, [string[]]>(async (opts, files) => {
        if (Boolean(opts.key) === Boolean(opts.publicKey)) throw new UsageError('give exactly one of --key FINGERPRINT and --public-key FILE');
        if (opts.signature.length && opts.signature.length !== files.length)
          throw new UsageError(`${opts.signature.length} signature(s) for ${files.length} file(s): give one --signature per file, in the same order`);
        await checkFiles([...files, ...opts.signature]);
        const publicKey = opts.publicKey
          ? await readFile(opts.publicKey, 'utf8').catch(() => Promise.reject(new UsageError(`cannot read ${opts.publicKey}`)))
          : undefined;
        const signatures = await Promise.all(opts.signature.map((f) => readFile(f)));
        const { kms } = await connect(opts);
        const job = await verifyFiles(kms, { files, fingerprint: opts.key, publicKey, signatures });
        const verdicts = (job.result?.signatures ?? []).map((v) => ({
          file: files[v.n] ?? v.name,
          valid: String(v.valid),
          signer: v.signer_fingerprint ?? '',
          signed_at: v.signed_at ?? '',
          reason: v.reason ?? '',
        }));
        print(opts, job, () => table(verdicts, ['file', 'valid', 'signer', 'signed_at', 'reason']));
        if (job.state !== 'completed' || !verdicts.length || verdicts.some((v) => v.valid !== 'true')) process.exitCode = EXIT.failed;
      }),
    );

  common(
    program
      .command('rewrap <files...>')
      .description('Bring messages encrypted to an older generation of a key to its current generation')
      .requiredOption('-k, --key <fingerprint>', "the key (any generation's fingerprint)")
      .option('--mode <mode>', 'rewrap (the session key only) or reencrypt (the whole message)', 'rewrap')
      .option('--passphrase-fd <n>', 'read the passphrase from this file descriptor'),
  )
    .addHelpText('after', examples('kms rewrap old/*.gpg --key 8F3A… --out current/', 'kms rewrap old.gpg --key 8F3A… --mode reencrypt'))
    .action(
      run<Common & { key: string; mode: string; passphraseFd?: string }, [string[]]>(async (opts, files) => {
        if (opts.mode !== 'rewrap' && opts.mode !== 'reencrypt') throw new UsageError('--mode is rewrap or reencrypt.');
        await checkFiles(files);
        const { kms } = await connect(opts);
        const passphrase = await readSecret({
          fd: opts.passphraseFd,
          env: 'KMS_PASSPHRASE',
          prompt: 'Key passphrase: ',
          what: 'passphrase',
          fdFlag: '--passphrase-fd',
        });
        const result = await withBar(opts, (onProgress, onSubmitted) =>
          rewrap(kms, {
            files,
            fingerprint: opts.key,
            passphrase,
            mode: opts.mode as 'rewrap' | 'reencrypt',
            outDir: opts.out,
            overwrite: opts.force,
            idempotencyKey: opts.idempotencyKey,
            noDownload: !opts.download,
            onProgress,
            onSubmitted,
          }),
        );
        report(opts, 'rewrapped', result);
      }),
    );
}
