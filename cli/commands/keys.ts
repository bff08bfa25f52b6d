import { readFile, writeFile } from 'node:fs/promises';
import { Option, type Command } from 'commander';
import { ClientError, refuseExistingOutputs, rotate, waitForJob } from '../../client/index.js';
import { bars, connect, fields, pagedFooter, print, table } from '../context.js';
import { EXIT, UsageError } from '../exit-codes.js';
import { readSecret } from '../secrets.js';
import { examples, int, run } from './common.js';

const KEY_COLUMNS = ['fingerprint', 'label', 'environment', 'profile', 'algorithm', 'status', 'generation', 'expires_at'] as const;
const PROFILES = ['rfc4880', 'rfc9580', 'pqc'] as const;
type Profile = (typeof PROFILES)[number];
const profileHelp = 'OpenPGP profile: rfc4880 (v4, read by every implementation), rfc9580 (v6, AEAD), pqc (v6 post-quantum)';
const passphraseHelp = 'The passphrase comes from --passphrase-fd N, else KMS_PASSPHRASE, else a prompt without echo.';

export function registerKeys(program: Command) {
  const keys = program.command('keys').description('OpenPGP keys: list, generate, inspect, disable, rotate, schedule');
  keys.addHelpText('after', examples('kms keys list', 'kms keys generate --label backups --name Ann --email ann@example.com', 'kms keys rotate <FPR>'));

  keys
    .command('list')
    .description('Your keys (and keys inherited through team access)')
    .option('--environment <env>', 'only this environment')
    .option('--label <label>', 'only this label')
    .addOption(new Option('--active <bool>', 'only active (true) or inactive (false) keys').choices(['true', 'false']))
    .option('--page <n>', 'page number', int('--page'), 1)
    .option('--page-size <n>', 'keys per page (≤ 100)', int('--page-size'), 50)
    .addHelpText('after', examples('kms keys list', 'kms keys list --environment production --json'))
    .action(
      run<{ environment?: string; label?: string; active?: 'true' | 'false'; page: number; pageSize: number }>(async (opts) => {
        const { kms } = await connect(opts);
        const page = await kms.data(
          kms.api.GET('/keys/list', {
            params: { query: { environment: opts.environment, label: opts.label, active: opts.active, page: opts.page, page_size: opts.pageSize } },
          }),
        );
        print(opts, page, () => table(page.items, KEY_COLUMNS) + pagedFooter(page));
      }),
    );

  keys
    .command('generate')
    .description('Generate a key (curve25519 and pqc at once; rsa3072/rsa4096 as a job that is waited for)')
    .requiredOption('--label <label>', 'a name for the key')
    .requiredOption('--name <name>', 'name in the OpenPGP user id')
    .requiredOption('--email <email>', 'email in the OpenPGP user id')
    .addOption(new Option('--profile <profile>', profileHelp).choices(PROFILES).default('rfc4880'))
    .addOption(new Option('--algorithm <alg>', 'key algorithm (rfc4880 only: rsa3072, rsa4096)').choices(['curve25519', 'rsa3072', 'rsa4096']))
    .option('--environment <env>', 'environment', 'production')
    .option('--expires-in-days <n>', 'key lifetime in days (1–3650); none: no expiry', int('--expires-in-days'))
    .option('--passphrase-fd <n>', 'read the passphrase from this file descriptor')
    .addHelpText(
      'after',
      examples(
        'kms keys generate --label backups --name Ann --email ann@example.com',
        'kms keys generate --label archive --name Ann --email ann@example.com --profile pqc',
        'kms keys generate --label big --name Ann --email ann@example.com --algorithm rsa4096 --passphrase-fd 3 3<pass.txt',
      ) + `\n${passphraseHelp}\n`,
    )
    .action(
      run<{
        label: string;
        name: string;
        email: string;
        profile: Profile;
        algorithm?: 'curve25519' | 'rsa3072' | 'rsa4096';
        environment: string;
        expiresInDays?: number;
        passphraseFd?: string;
      }>(async (opts) => {
        const { kms } = await connect(opts);
        const passphrase = await readSecret({
          fd: opts.passphraseFd,
          env: 'KMS_PASSPHRASE',
          prompt: 'New key passphrase (12+ characters): ',
          what: 'passphrase',
          fdFlag: '--passphrase-fd',
          confirm: true,
        });
        const answer = await kms.data(
          kms.api.POST('/keys/generate-key', {
            body: {
              label: opts.label,
              name: opts.name,
              email: opts.email,
              profile: opts.profile,
              algorithm: opts.algorithm,
              environment: opts.environment,
              expires_in_days: opts.expiresInDays,
              passphrase,
            },
            headers: { prefer: 'wait=30' },
          }),
        );
        if ('fingerprint' in answer) return print(opts, answer, () => fields(answer, [...KEY_COLUMNS, 'uid']));
        const bar = bars(opts);
        const job = await waitForJob(kms, answer, { onProgress: bar.onProgress }).finally(() => bar.stop());
        const made = job.result?.key;
        if (!made) throw new ClientError('unexpected_answer', `Key generation job ${job.job_id} completed without the key.`);
        print(opts, job, () => fields(made, [...KEY_COLUMNS, 'uid']));
      }),
    );

  keys
    .command('import <file>')
    .description('Import an armored OpenPGP key: a secret key becomes a managed key, a public key a recipient key (encrypt and verify only)')
    .requiredOption('--label <label>', 'a name for the key')
    .option('--environment <env>', 'environment', 'production')
    .option('--passphrase-fd <n>', 'read the passphrase the key will have here from this file descriptor (secret keys)')
    .option('--key-passphrase-fd <n>', 'read the passphrase the key is locked with now from this file descriptor')
    .option('--unprotected', 'the secret key is not locked with a passphrase (as `sq key generate` makes them)')
    .addHelpText(
      'after',
      examples(
        'gpg --export-secret-keys --armor ann@example.com > ann.asc && kms keys import ann.asc --label ann',
        'gpg --export --armor partner@example.com > partner.asc && kms keys import partner.asc --label partner',
      ) +
        `\nA secret key's new passphrase comes from --passphrase-fd N, else KMS_PASSPHRASE, else a prompt; the one it is locked with from --key-passphrase-fd N, else KMS_KEY_PASSPHRASE, else a prompt.\n`,
    )
    .action(
      run<{ label: string; environment: string; passphraseFd?: string; keyPassphraseFd?: string; unprotected?: boolean }, [string]>(async (opts, file) => {
        const key = await readFile(file, 'utf8').catch(() => Promise.reject(new UsageError(`cannot read ${file}`)));
        if (!/-----BEGIN PGP (PUBLIC|PRIVATE) KEY BLOCK-----/.test(key)) throw new UsageError(`${file} is not an armored OpenPGP key (export it with --armor)`);
        const secret = key.includes('-----BEGIN PGP PRIVATE KEY BLOCK-----');
        const { kms } = await connect(opts);
        const keyPassphrase =
          secret && !opts.unprotected
            ? await readSecret({
                fd: opts.keyPassphraseFd,
                env: 'KMS_KEY_PASSPHRASE',
                prompt: 'Passphrase the key is locked with: ',
                what: 'key passphrase',
                fdFlag: '--key-passphrase-fd',
              })
            : undefined;
        const passphrase = secret
          ? await readSecret({
              fd: opts.passphraseFd,
              env: 'KMS_PASSPHRASE',
              prompt: 'New key passphrase (12+ characters): ',
              what: 'passphrase',
              fdFlag: '--passphrase-fd',
              confirm: true,
            })
          : undefined;
        const answer = await kms.data(
          kms.api.POST('/keys/import', { body: { key, label: opts.label, environment: opts.environment, passphrase, key_passphrase: keyPassphrase } }),
        );
        print(opts, answer, () => fields(answer, [...KEY_COLUMNS, 'kind', 'uid']));
      }),
    );

  keys
    .command('show <fingerprint>')
    .description("A key's details, by any generation's fingerprint")
    .addHelpText('after', examples('kms keys show 8F3A…', 'kms keys show 8F3A… --json | jq .key.generation'))
    .action(
      run<object, [string]>(async (opts, fingerprint) => {
        const { kms } = await connect(opts);
        const answer = await kms.data(kms.api.POST('/keys/get-public-key', { body: { fingerprint } }));
        print(opts, answer, () => fields({ ...answer.key, requested_fingerprint: answer.requested_fingerprint }));
      }),
    );

  keys
    .command('public <fingerprint>')
    .description("The armored public key of the key's current generation (to give to gpg users)")
    .option('-o, --out <file>', 'write it to a file instead of standard output')
    .option('-f, --force', 'replace --out if it exists')
    .addHelpText('after', examples('kms keys public 8F3A… | gpg --import', 'kms keys public 8F3A… -o ann.asc'))
    .action(
      run<{ out?: string; force?: boolean }, [string]>(async (opts, fingerprint) => {
        if (opts.out) await refuseExistingOutputs([opts.out], opts.force);
        const { kms } = await connect(opts);
        const answer = await kms.data(kms.api.POST('/keys/get-public-key', { body: { fingerprint } }));
        if (opts.out) {
          await writeFile(opts.out, answer.public_key);
          return print(opts, { fingerprint: answer.fingerprint, file: opts.out }, `wrote ${opts.out}`);
        }
        print(opts, { fingerprint: answer.fingerprint, public_key: answer.public_key }, answer.public_key);
      }),
    );

  keys
    .command('disable <fingerprint>')
    .description('Disable a key for good: it stops encrypting and rotating (it still decrypts)')
    .addHelpText('after', examples('kms keys disable 8F3A…'))
    .action(
      run<object, [string]>(async (opts, fingerprint) => {
        const { kms } = await connect(opts);
        const key = await kms.data(kms.api.POST('/keys/disable-key', { body: { fingerprint } }));
        print(opts, key, () => `disabled ${key.fingerprint} (${key.label})`);
      }),
    );

  keys
    .command('rotate <fingerprint>')
    .description('Rotate a key now (a new generation); optionally change its passphrase or its profile')
    .option('--change-passphrase', 'also set a new passphrase (the current one is needed)')
    .addOption(new Option('--profile <profile>', `${profileHelp}; kept for later rotations`).choices(PROFILES))
    .option('--passphrase-fd <n>', 'read the current passphrase from this file descriptor')
    .option('--new-passphrase-fd <n>', 'read the new passphrase from this file descriptor (else KMS_NEW_PASSPHRASE or a prompt)')
    .option('--no-wait', 'answer once the rotation job is queued')
    .addHelpText('after', examples('kms keys rotate 8F3A…', 'kms keys rotate 8F3A… --change-passphrase', 'kms keys rotate 8F3A… --profile rfc9580'))
    .action(
      run<{ changePassphrase?: boolean; passphraseFd?: string; newPassphraseFd?: string; profile?: Profile; wait: boolean }, [string]>(
        async (opts, fingerprint) => {
          const { kms } = await connect(opts);
          let currentPassphrase: string | undefined;
          let newPassphrase: string | undefined;
          if (opts.changePassphrase) {
            currentPassphrase = await readSecret({
              fd: opts.passphraseFd,
              env: 'KMS_PASSPHRASE',
              prompt: 'Current passphrase: ',
              what: 'passphrase',
              fdFlag: '--passphrase-fd',
            });
            newPassphrase = await readSecret({
              fd: opts.newPassphraseFd,
              env: 'KMS_NEW_PASSPHRASE',
              prompt: 'New passphrase: ',
              what: 'new passphrase',
              fdFlag: '--new-passphrase-fd',
              confirm: true,
            });
          }
          const bar = bars(opts);
          const job = await rotate(kms, {
            fingerprint,
            currentPassphrase,
            newPassphrase,
            profile: opts.profile,
            noWait: !opts.wait,
            onProgress: bar.onProgress,
          }).finally(() => bar.stop());
          if (job.state !== 'completed') return print(opts, job, `rotation job ${job.job_id} is ${job.state} (\`kms jobs wait ${job.job_id}\`)`);
          const result = job.result ?? {};
          if (result.rotated === undefined || result.from_generation === undefined)
            throw new ClientError('unexpected_answer', `Rotation job ${job.job_id} completed without saying what it made.`);
          const made = `generation ${result.from_generation + 1}, fingerprint ${result.new_fingerprint ?? '-'}`;
          if (result.rotated)
            return print(opts, job, `rotated: now ${made} (was generation ${result.from_generation}, ${result.old_fingerprint ?? fingerprint})`);
          // Another rotation made the generation asked for meanwhile: the key has moved on, as asked.
          if (result.reason === 'already_rotated') return print(opts, job, `already rotated by another rotation: now ${made}`);
          print(opts, job, `not rotated: the key ${result.reason === 'disabled' ? 'is disabled' : 'no longer exists'}`);
          process.exitCode = EXIT.failed;
        },
      ),
    );

  keys
    .command('schedule <fingerprint>')
    .description("Set a key's rotation schedule")
    .option('--days <n>', 'rotate every N days (1–730)', int('--days'))
    .option('--off', 'no scheduled or policy rotation')
    .option('--account-policy', "follow the account's rotation policy (the default)")
    .addOption(new Option('--profile <profile>', `the profile later generations are made with; ${profileHelp}`).choices(PROFILES))
    .addHelpText(
      'after',
      examples(
        'kms keys schedule 8F3A… --days 90',
        'kms keys schedule 8F3A… --off',
        'kms keys schedule 8F3A… --account-policy',
        'kms keys schedule 8F3A… --profile pqc',
      ),
    )
    .action(
      run<{ days?: number; off?: boolean; accountPolicy?: boolean; profile?: Profile }, [string]>(async (opts, fingerprint) => {
        const given = [opts.days !== undefined, Boolean(opts.off), Boolean(opts.accountPolicy)].filter(Boolean).length;
        if (given > 1 || (given === 0 && !opts.profile)) throw new UsageError('Give one of --days N, --off and --account-policy, and/or --profile.');
        const { kms } = await connect(opts);
        const body = {
          ...(opts.accountPolicy ? { use_account_policy: true as const } : given ? { rotation_interval_days: opts.off ? null : opts.days! } : {}),
          ...(opts.profile ? { profile: opts.profile } : {}),
        };
        const schedule = await kms.data(kms.api.POST('/keys/{fingerprint}/rotation-schedule', { params: { path: { fingerprint } }, body }));
        print(opts, schedule, () => fields(schedule));
      }),
    );

  keys
    .command('history [fingerprint]')
    .description("Rotation history: one key's lineage, or every rotation of the account")
    .addOption(new Option('--status <status>', 'only succeeded or failed rotations').choices(['succeeded', 'failed']))
    .addOption(new Option('--trigger <trigger>', 'only rotations started this way').choices(['manual', 'schedule', 'policy']))
    .option('--page <n>', 'page number', int('--page'), 1)
    .option('--page-size <n>', 'entries per page', int('--page-size'), 50)
    .addHelpText('after', examples('kms keys history', 'kms keys history 8F3A… --status failed'))
    .action(
      run<{ status?: 'succeeded' | 'failed'; trigger?: 'manual' | 'schedule' | 'policy'; page: number; pageSize: number }, [string | undefined]>(
        async (opts, fingerprint) => {
          const { kms } = await connect(opts);
          const query = { status: opts.status, trigger: opts.trigger, page: opts.page, page_size: opts.pageSize };
          const page = fingerprint
            ? await kms.data(kms.api.GET('/keys/{fingerprint}/rotation-history', { params: { path: { fingerprint }, query } }))
            : await kms.data(kms.api.GET('/keys/rotation-history', { params: { query } }));
          const rows = page.items as unknown as Record<string, unknown>[];
          const columns = rows[0]
            ? Object.keys(rows[0])
                .filter((k) => !/^(id|user_id|lineage_id|job_id|error)$/.test(k))
                .slice(0, 7)
            : [];
          print(opts, page, () => table(rows, columns) + pagedFooter(page));
        },
      ),
    );
}
