import { Option, type Command } from 'commander';
import { Kms } from '../../client/index.js';
import { resolveTarget, saveCredentials } from '../config.js';
import { CLI_VERSION, connect, fields, pagedFooter, print, table } from '../context.js';
import { UsageError } from '../exit-codes.js';
import { readSecret } from '../secrets.js';
import { examples, int, run } from './common.js';
import { registerAuditEvidence } from './audit.js';

const PROFILE_FIELDS = [
  'user_id',
  'username',
  'email',
  'pending_email',
  'email_verified',
  'company_name',
  'role',
  'rotation_interval_days',
  'created_at',
] as const;
const passwordHelp = (fdFlag: string, env: string) =>
  `The ${fdFlag === '--password-fd' ? 'current ' : ''}password comes from ${fdFlag} N, else ${env}, else a prompt without echo.`;

const paging = (cmd: Command, what: string) =>
  cmd.option('--page <n>', 'page number', int('--page'), 1).option('--page-size <n>', `${what} per page (≤ 100)`, int('--page-size'), 50);

interface Paging {
  page: number;
  pageSize: number;
}

/** `kms audit`, `kms profile`, `kms org` and `kms password`: the account's own records and settings. */
export function registerAccount(program: Command) {
  const audit = paging(
    program
      .command('audit')
      .description("Your account's audit log, newest first")
      .option('--action <action>', 'only this action (e.g. sessions.login), or a prefix ending in * (auth.*)')
      .addOption(new Option('--status <status>', 'only successes or failures').choices(['success', 'failure'])),
    'entries',
  )
    .addHelpText('after', examples('kms audit', "kms audit --action 'sessions.*' --status failure", 'kms audit --page 2 --json | jq .items'))
    .action(
      run<Paging & { action?: string; status?: 'success' | 'failure' }>(async (opts) => {
        const { kms } = await connect(opts);
        const page = await kms.data(
          kms.api.GET('/audit-logs', { params: { query: { action: opts.action, status: opts.status, page: opts.page, page_size: opts.pageSize } } }),
        );
        print(opts, page, () => table(page.items, ['created_at', 'action', 'status', 'target', 'ip']) + pagedFooter(page));
      }),
    );
  registerAuditEvidence(audit);

  const profile = program.command('profile').description('Your profile: show it, change your username, email or company name');
  profile.addHelpText('after', examples('kms profile show', 'kms profile update --company "Example Ltd"'));

  profile
    .command('show')
    .description('Your profile')
    .action(
      run(async (opts) => {
        const { kms } = await connect(opts);
        const me = await kms.data(kms.api.GET('/auth/me', {}));
        print(opts, me, () => fields(me, [...PROFILE_FIELDS.filter((f) => f !== 'pending_email'), 'authenticated_via']));
      }),
    );

  profile
    .command('update')
    .description('Change your username or company name; a new email takes effect once confirmed from the mail sent to it')
    .option('--username <name>', 'a new username')
    .option('--company <name>', 'a new company name')
    .option('--no-company', 'remove the company name')
    .option('--email <email>', 'a new email (needs your current password and a recent sign-in)')
    .option('--password-fd <n>', 'read the current password from this file descriptor (with --email)')
    .addHelpText(
      'after',
      examples('kms profile update --company "Example Ltd"', 'kms profile update --email ann@new.example   # asks for the current password') +
        `\n${passwordHelp('--password-fd', 'KMS_PASSWORD')}\n`,
    )
    .action(
      run<{ username?: string; company?: string | false; email?: string; passwordFd?: string }>(async (opts) => {
        if (opts.username === undefined && opts.company === undefined && opts.email === undefined)
          throw new UsageError('Give at least one of --username, --company, --no-company and --email.');
        const { kms } = await connect(opts);
        const currentPassword =
          opts.email === undefined
            ? undefined
            : await readSecret({ fd: opts.passwordFd, env: 'KMS_PASSWORD', prompt: 'Current password: ', what: 'password', fdFlag: '--password-fd' });
        const body = {
          username: opts.username,
          email: opts.email,
          company_name: opts.company === false ? null : opts.company,
          current_password: currentPassword,
        };
        const me = await kms.data(kms.api.PUT('/profile/update', { body }));
        print(opts, me, () => fields(me, PROFILE_FIELDS) + (me.pending_email ? `\nconfirm the change from the mail sent to ${me.pending_email}` : ''));
      }),
    );

  const org = program.command('org').description('Your organization: its members and invitations');
  org.addHelpText('after', examples('kms org show', 'kms org members', 'kms org invitations --state pending'));

  org
    .command('show')
    .description('Your organization and your role in it')
    .action(
      run(async (opts) => {
        const { kms } = await connect(opts);
        const o = await kms.data(kms.api.GET('/organization', {}));
        print(opts, o, () => fields(o));
      }),
    );

  paging(org.command('members').description('Members of your organization, longest-standing first'), 'members').action(
    run<Paging>(async (opts) => {
      const { kms } = await connect(opts);
      const page = await kms.data(kms.api.GET('/organization/members', { params: { query: { page: opts.page, page_size: opts.pageSize } } }));
      print(opts, page, () => table(page.items, ['username', 'email', 'role', 'joined_at', 'user_id']) + pagedFooter(page));
    }),
  );

  paging(
    org
      .command('invitations')
      .description("Your organization's invitations, newest first (owner or admin)")
      .addOption(new Option('--state <state>', 'only invitations in this state').choices(['pending', 'accepted', 'revoked', 'expired'])),
    'invitations',
  ).action(
    run<Paging & { state?: 'pending' | 'accepted' | 'revoked' | 'expired' }>(async (opts) => {
      const { kms } = await connect(opts);
      const page = await kms.data(
        kms.api.GET('/organization/invitations', { params: { query: { state: opts.state, page: opts.page, page_size: opts.pageSize } } }),
      );
      print(opts, page, () => table(page.items, ['email', 'role', 'state', 'expires_at', 'invitation_id']) + pagedFooter(page));
    }),
  );

  const password = program.command('password').description('Change your password, or reset a forgotten one with the token mailed to you');
  password.addHelpText(
    'after',
    examples('kms password change', 'kms password forgot --email ann@example.com', 'kms password reset --token <TOKEN from the mail>'),
  );

  password
    .command('change')
    .description('Change your password: every other session ends, and the stored login gets the new session')
    .option('--password-fd <n>', 'read the current password from this file descriptor')
    .option('--new-password-fd <n>', 'read the new password from this file descriptor')
    .addHelpText(
      'after',
      examples('kms password change', 'kms password change --password-fd 3 --new-password-fd 4 3<old.txt 4<new.txt') +
        `\n${passwordHelp('--password-fd', 'KMS_PASSWORD')}\n${passwordHelp('--new-password-fd', 'KMS_NEW_PASSWORD')}\n`,
    )
    .action(
      run<{ passwordFd?: string; newPasswordFd?: string }>(async (opts) => {
        const { kms, target } = await connect(opts);
        const current = await readSecret({ fd: opts.passwordFd, env: 'KMS_PASSWORD', prompt: 'Current password: ', what: 'password', fdFlag: '--password-fd' });
        const next = await readSecret({
          fd: opts.newPasswordFd,
          env: 'KMS_NEW_PASSWORD',
          prompt: 'New password (12+ characters): ',
          what: 'new password',
          fdFlag: '--new-password-fd',
          confirm: true,
        });
        const { session } = await kms.data(kms.api.POST('/profile/change-password', { body: { current_password: current, new_password: next } }));
        // The stored session has just ended with the others: keep the new one in its place.
        const stored = target.source === 'credentials' && target.creds?.kind === 'session';
        if (stored) await saveCredentials({ ...target.creds!, token: session.token, expires_at: session.expires_at });
        print(
          opts,
          { status: 'password_changed', expires_at: session.expires_at, stored },
          `password changed; other sessions have ended${stored ? ' (this login continues)' : ''}`,
        );
      }),
    );

  password
    .command('forgot')
    .description('Ask for a password reset: a token is mailed to the address if it has an account')
    .requiredOption('--email <email>', "the account's email")
    .action(
      run<{ email: string }>(async (opts) => {
        const anon = await anonymous(opts.url);
        const answer = await anon.data(anon.api.POST('/auth/forgot-password', { body: { email: opts.email } }));
        print(opts, answer, `${answer.message}\nthen: kms password reset --token <TOKEN>`);
      }),
    );

  password
    .command('reset')
    .description('Set a new password with the token from the reset mail (every session ends: log in again)')
    .requiredOption('--token <token>', 'the token from the mail')
    .option('--new-password-fd <n>', 'read the new password from this file descriptor')
    .addHelpText('after', examples('kms password reset --token <TOKEN>') + `\n${passwordHelp('--new-password-fd', 'KMS_NEW_PASSWORD')}\n`)
    .action(
      run<{ token: string; newPasswordFd?: string }>(async (opts) => {
        const anon = await anonymous(opts.url);
        const next = await readSecret({
          fd: opts.newPasswordFd,
          env: 'KMS_NEW_PASSWORD',
          prompt: 'New password (12+ characters): ',
          what: 'new password',
          fdFlag: '--new-password-fd',
          confirm: true,
        });
        const answer = await anon.data(anon.api.POST('/auth/reset-password', { body: { token: opts.token, new_password: next } }));
        print(opts, answer, 'password reset: log in with `kms login`');
      }),
    );
}

/** A client without credentials, for the public routes. */
async function anonymous(url: string | undefined): Promise<Kms> {
  const target = await resolveTarget(url);
  return new Kms({ url: target.url, userAgent: `kms-cli/${CLI_VERSION} node/${process.versions.node}` });
}
