/**
 * The `kms` command line: the client library (client/) behind commander subcommands. Errors end the
 * process with the documented exit codes (cli/exit-codes.ts): 0 ok, 1 failed, 2 usage, 3 auth,
 * 4 not found, 5 limit.
 */
import { Command, CommanderError, Option } from 'commander';
import { ClientError, ProblemError } from '../client/index.js';
import { CLI_VERSION } from './context.js';
import { EXIT, errorCode, exitCodeFor } from './exit-codes.js';
import { registerAuth } from './commands/auth.js';
import { registerKeys } from './commands/keys.js';
import { registerFiles } from './commands/files.js';
import { registerJobs } from './commands/jobs.js';
import { registerApiKeys, registerShares } from './commands/sharing.js';
import { registerAccount } from './commands/account.js';
import { checkIds, examples } from './commands/common.js';

export function buildProgram(): Command {
  const program = new Command('kms')
    .version(CLI_VERSION)
    .description('Key management and file encryption service: keys, encryption jobs, API keys and shares')
    .exitOverride()
    .showHelpAfterError('(run with --help for usage)')
    .addOption(new Option('--url <url>', 'the service (default: KMS_URL, then the URL you logged in to, then http://localhost:3000)'))
    .option('--json', 'machine-readable output on stdout (errors as JSON on stderr); no progress bars')
    .option('-q, --quiet', 'no progress bars or retry notes')
    .option('--no-progress', 'no progress bars')
    .addHelpText(
      'after',
      examples(
        'kms login -u ann',
        'kms keys generate --label backups --name Ann --email ann@example.com',
        'kms encrypt report.pdf --key <FPR> --out encrypted/',
        'kms decrypt encrypted/report.pdf.gpg --key <FPR> --out plain/',
      ) +
        `
Environment: KMS_URL (service), KMS_API_KEY (wins over the stored login), KMS_PASSPHRASE, KMS_NEW_PASSPHRASE,
KMS_PASSWORD, KMS_NEW_PASSWORD. Credentials: $XDG_CONFIG_HOME/kms/credentials.json (else ~/.config/kms/credentials.json), mode 0600.
Exit codes: 0 ok, 1 failed (job failed, request refused), 2 usage, 3 authentication or permission,
4 not found or gone, 5 limit (rate limit, size, quota).
`,
    );
  registerAuth(program);
  registerKeys(program);
  registerFiles(program);
  registerJobs(program);
  registerApiKeys(program);
  registerShares(program);
  registerAccount(program);
  // exitOverride and the error output apply to every subcommand.
  const inherit = (cmd: Command) => {
    cmd.exitOverride();
    cmd.commands.forEach(inherit);
  };
  inherit(program);
  checkIds(program);
  return program;
}

/** Prints an error (human or --json) and answers its exit code. */
export function reportError(err: unknown, json: boolean): number {
  const code = exitCodeFor(err);
  // The client library names its own option for replacing outputs; the CLI's is --force.
  const message =
    err instanceof ClientError && err.code === 'output_exists' && err.path
      ? `${err.path} exists (use --force to replace it).`
      : err instanceof Error
        ? err.message
        : String(err);
  if (json) {
    const problem = err instanceof ProblemError ? err.problem : undefined;
    process.stderr.write(
      `${JSON.stringify({ error: { code: errorCode(err), message, status: problem?.status, errors: problem?.errors, exit_code: code } })}\n`,
    );
  } else {
    process.stderr.write(`kms: ${message}${message.includes(`(${errorCode(err)})`) ? '' : ` [${errorCode(err)}]`}\n`);
    if (err instanceof ProblemError) for (const e of err.problem.errors ?? []) process.stderr.write(`  ${e.path}: ${e.message}\n`);
    if (code === EXIT.auth && err instanceof ProblemError && err.status === 401)
      process.stderr.write('  Log in again with `kms login` (or check KMS_API_KEY).\n');
  }
  return code;
}

export async function main(argv: string[]): Promise<number> {
  const program = buildProgram();
  const json = argv.includes('--json');
  try {
    await program.parseAsync(argv, { from: 'user' });
    // A command that printed its answer without succeeding (kms verify of a bad signature) set the code.
    return Number(process.exitCode ?? EXIT.ok);
  } catch (err) {
    if (err instanceof CommanderError) {
      // Help and version are not errors; everything else commander refuses is a usage error.
      return err.exitCode === 0 ? EXIT.ok : EXIT.usage;
    }
    return reportError(err, json);
  }
}

const code = await main(process.argv.slice(2));
// Exit now that the command is done: a connection the service left open must not keep the process
// waiting. Standard output is flushed first (pipes and files are written synchronously on Linux and
// macOS, but a terminal may not be).
process.stdout.write('', () => process.exit(code));
