import { Option, type Command } from 'commander';
import { Kms } from '../../client/index.js';
import { DEFAULT_URL, credentialsPath, removeCredentials, resolveTarget, saveCredentials } from '../config.js';
import { connect, fields, print, CLI_VERSION } from '../context.js';
import { UsageError } from '../exit-codes.js';
import { firstLine, promptHidden, promptLine, readSecret, readStdin } from '../secrets.js';
import { examples, run } from './common.js';

export function registerAuth(program: Command) {
  program
    .command('login')
    .description('Sign in and store the session (or an API key) in the config folder, readable by you alone')
    .option('-u, --username <name>', 'username or email (asked for on a terminal when missing)')
    .option('--password-fd <n>', 'read the password from this file descriptor')
    .option('--password-stdin', 'read the password from standard input')
    .option('--api-key', 'store an API key read from standard input instead of signing in with a password')
    .addHelpText(
      'after',
      examples(
        'kms login --url https://kms.example.com -u ann          # asks for the password',
        'kms login -u ann --password-stdin < ~/.kms-password',
        'echo "$KEY" | kms login --api-key',
      ) + `\nThe password may also come from KMS_PASSWORD. Stored in ${credentialsPath()} (mode 0600).\n`,
    )
    .action(
      run<{ username?: string; passwordFd?: string; passwordStdin?: boolean; apiKey?: boolean }>(async (opts) => {
        const target = await resolveTarget(opts.url);
        const url = target.url;
        const anon = new Kms({ url, userAgent: `kms-cli/${CLI_VERSION}` });
        if (opts.apiKey) {
          const key = process.stdin.isTTY ? await promptHidden('API key: ') : firstLine(await readStdin()).trim();
          if (!key) throw new UsageError('No API key on standard input.');
          anon.token = key;
          // Checks the key before storing it; a key without `account:read` is stored all the same.
          const me = await anon.data(anon.api.GET('/auth/me', {})).catch((err: unknown) => {
            if ((err as { code?: string }).code === 'insufficient_scope') return undefined;
            throw err;
          });
          const path = await saveCredentials({ url, token: key, kind: 'api_key', username: me?.username });
          print(
            opts,
            { url, kind: 'api_key', username: me?.username ?? null, credentials: path },
            `stored the API key for ${url}${me ? ` (${me.username})` : ''} in ${path}`,
          );
          return;
        }
        let identifier = opts.username;
        if (!identifier) {
          if (!process.stdin.isTTY) throw new UsageError('Give --username when not on a terminal.');
          identifier = await promptLine('Username or email: ');
        }
        const password = opts.passwordStdin
          ? firstLine(await readStdin())
          : await readSecret({ fd: opts.passwordFd, env: 'KMS_PASSWORD', prompt: 'Password: ', what: 'password', fdFlag: '--password-fd' });
        const { session, user } = await anon.data(anon.api.POST('/auth/login', { body: { identifier, password } }));
        const path = await saveCredentials({ url, token: session.token, kind: 'session', username: user.username, expires_at: session.expires_at });
        print(
          opts,
          { url, kind: 'session', username: user.username, expires_at: session.expires_at, credentials: path },
          `logged in to ${url} as ${user.username} (session until ${session.expires_at})`,
        );
      }),
    );

  program
    .command('register')
    .description('Create an account and log in (the partner API key it issues is printed once)')
    .requiredOption('-u, --username <name>', 'username (3–64 of A-Z a-z 0-9 . _ -)')
    .requiredOption('--email <email>', 'email address')
    .option('--company <name>', 'company name')
    .option('--password-fd <n>', 'read the password from this file descriptor')
    .option('--password-stdin', 'read the password from standard input')
    .addHelpText(
      'after',
      examples('kms register -u ann --email ann@example.com        # asks for a password (12+ characters) twice') +
        '\nThe password may also come from KMS_PASSWORD.\n',
    )
    .action(
      run<{ username: string; email: string; company?: string; passwordFd?: string; passwordStdin?: boolean }>(async (opts) => {
        const { url } = await resolveTarget(opts.url);
        const anon = new Kms({ url, userAgent: `kms-cli/${CLI_VERSION}` });
        const password = opts.passwordStdin
          ? firstLine(await readStdin())
          : await readSecret({
              fd: opts.passwordFd,
              env: 'KMS_PASSWORD',
              prompt: 'New password (12+ characters): ',
              what: 'password',
              fdFlag: '--password-fd',
              confirm: true,
            });
        const made = await anon.data(
          anon.api.POST('/partners/register', { body: { username: opts.username, email: opts.email, password, company_name: opts.company } }),
        );
        const path = await saveCredentials({
          url,
          token: made.session.token,
          kind: 'session',
          username: made.user.username,
          expires_at: made.session.expires_at,
        });
        print(
          opts,
          { url, username: made.user.username, user_id: made.user.user_id, partner_api_key: made.partner_api_key, credentials: path },
          `registered ${made.user.username} at ${url} and logged in\npartner API key (shown once, store it now): ${made.partner_api_key.api_key}`,
        );
      }),
    );

  program
    .command('whoami')
    .description('Show the account the stored login (or KMS_API_KEY) acts as')
    .addHelpText('after', examples('kms whoami', 'kms whoami --json | jq -r .username'))
    .action(
      run(async (opts) => {
        const { kms, target } = await connect(opts);
        const me = await kms.data(kms.api.GET('/auth/me', {}));
        print(opts, { ...me, url: target.url, credential: target.source === 'KMS_API_KEY' ? 'KMS_API_KEY' : target.creds?.kind }, () =>
          fields({
            username: me.username,
            email: me.email,
            role: me.role,
            url: target.url,
            credential: target.source === 'KMS_API_KEY' ? 'KMS_API_KEY' : target.creds?.kind,
          }),
        );
      }),
    );

  program
    .command('logout')
    .description('Forget the stored login; with --revoke, also end every session of the account on the service')
    .addOption(new Option('--revoke', 'POST /auth/logout first: every session token of the account stops working (API keys stay)'))
    .addHelpText('after', examples('kms logout', 'kms logout --revoke'))
    .action(
      run<{ revoke?: boolean }>(async (opts) => {
        const target = await resolveTarget(opts.url);
        if (opts.revoke && target.creds?.kind === 'session' && target.source === 'credentials') {
          const { kms } = await connect(opts);
          await kms.data(kms.api.POST('/auth/logout', {}));
        }
        const removed = await removeCredentials();
        print(opts, { logged_out: removed, revoked: Boolean(opts.revoke) }, removed ? `logged out of ${target.creds?.url ?? DEFAULT_URL}` : 'not logged in');
      }),
    );
}
