import { Option, type Command } from 'commander';
import { SCOPES, type Scope } from '../../client/index.js';
import { connect, fields, pagedFooter, print, table } from '../context.js';
import { examples, int, run } from './common.js';

const API_KEY_COLUMNS = ['key_id', 'name', 'prefix', 'status', 'scopes', 'expires_at', 'last_used_at', 'use_count'] as const;
const SHARE_COLUMNS = ['share_id', 'state', 'view_count', 'max_views', 'expires_at', 'created_at'] as const;
const states = ['active', 'expired', 'revoked', 'exhausted'] as const;

export function registerApiKeys(program: Command) {
  const apiKeys = program.command('api-keys').description('Managed API keys for programs (needs a password login: API keys cannot manage API keys)');
  apiKeys.addHelpText(
    'after',
    examples('kms api-keys create --name ci --scope crypto:encrypt --scope jobs:read', 'kms api-keys list', 'kms api-keys revoke <ID>'),
  );

  apiKeys
    .command('list')
    .description('Your API keys: metadata and usage, never values')
    .addOption(new Option('--status <status>', 'only keys in this status').choices(['active', 'expired', 'revoked']))
    .option('--page <n>', 'page number', int('--page'), 1)
    .addHelpText('after', examples('kms api-keys list', 'kms api-keys list --status active --json'))
    .action(
      run<{ status?: 'active' | 'expired' | 'revoked'; page: number }>(async (opts) => {
        const { kms } = await connect(opts);
        const page = await kms.data(kms.api.GET('/api-keys', { params: { query: { status: opts.status, page: opts.page } } }));
        print(
          opts,
          page,
          () =>
            table(
              page.items.map((k) => ({ ...k, scopes: k.scopes.join(',') })),
              API_KEY_COLUMNS,
            ) + pagedFooter(page),
        );
      }),
    );

  apiKeys
    .command('create')
    .description('Create an API key with scopes; its value is printed once here (and by `show`)')
    .requiredOption('--name <name>', 'what the key is for')
    .addOption(new Option('--scope <scope...>', 'what it may do (repeatable)').choices(SCOPES).makeOptionMandatory())
    .option('--expires-in-days <n>', 'lifetime in days (≤ 3650); none: no expiry', int('--expires-in-days'))
    .addHelpText(
      'after',
      examples(
        'kms api-keys create --name backup-job --scope crypto:encrypt --scope jobs:read --expires-in-days 90',
        'KMS_API_KEY=$(kms api-keys create --name ci --scope keys:read --json | jq -r .value) kms keys list',
      ),
    )
    .action(
      run<{ name: string; scope: Scope[]; expiresInDays?: number }>(async (opts) => {
        const { kms } = await connect(opts);
        const key = await kms.data(kms.api.POST('/api-keys/generate', { body: { name: opts.name, scopes: opts.scope, expires_in_days: opts.expiresInDays } }));
        print(opts, key, () => `${fields(key, ['key_id', 'name', 'prefix', 'scopes', 'expires_at'])}\nvalue  ${key.value}`);
      }),
    );

  apiKeys
    .command('show <key_id>')
    .description('One API key with its current value (the read is audited)')
    .addHelpText('after', examples('kms api-keys show 4c1d…', 'kms api-keys show 4c1d… --json | jq -r .value'))
    .action(
      run<object, [string]>(async (opts, id) => {
        const { kms } = await connect(opts);
        const key = await kms.data(kms.api.GET('/api-keys/{key_id}', { params: { path: { key_id: id } } }));
        print(opts, key, () => fields(key));
      }),
    );

  apiKeys
    .command('rotate <key_id>')
    .description('A new value; the old one keeps working for --grace-seconds (default 0: it stops at once)')
    .option('--grace-seconds <n>', 'how long the old value keeps working (0–604800)', int('--grace-seconds'))
    .addHelpText('after', examples('kms api-keys rotate 4c1d…', 'kms api-keys rotate 4c1d… --grace-seconds 3600'))
    .action(
      run<{ graceSeconds?: number }, [string]>(async (opts, id) => {
        const { kms } = await connect(opts);
        const key = await kms.data(kms.api.POST('/api-keys/{key_id}/rotate', { params: { path: { key_id: id } }, body: { grace_seconds: opts.graceSeconds } }));
        print(opts, key, () => `${fields(key, ['key_id', 'name', 'previous_value_expires_at'])}\nvalue  ${key.value}`);
      }),
    );

  apiKeys
    .command('revoke <key_id>')
    .description('Revoke an API key at once (every value of it)')
    .addHelpText('after', examples('kms api-keys revoke 4c1d…'))
    .action(
      run<object, [string]>(async (opts, id) => {
        const { kms } = await connect(opts);
        await kms.data(kms.api.DELETE('/api-keys/{key_id}', { params: { path: { key_id: id } } }));
        print(opts, { revoked: id }, `revoked ${id}`);
      }),
    );

  apiKeys
    .command('share <key_id>')
    .description("A link that hands out the key's value (expires in 24 h, one view, unless told otherwise)")
    .option('--expires-in-hours <n>', 'link lifetime (1–720)', int('--expires-in-hours'))
    .option('--max-views <n>', 'views allowed (1–100)', int('--max-views'))
    .addHelpText('after', examples('kms api-keys share 4c1d… --expires-in-hours 2'))
    .action(
      run<{ expiresInHours?: number; maxViews?: number }, [string]>(async (opts, id) => {
        const { kms } = await connect(opts);
        const share = await kms.data(
          kms.api.POST('/api-keys/{key_id}/share', {
            params: { path: { key_id: id } },
            body: { expires_in_hours: opts.expiresInHours, max_views: opts.maxViews },
          }),
        );
        print(opts, share, () => fields(share, ['share_id', 'url', 'expires_at', 'max_views']));
      }),
    );

  apiKeys
    .command('shares <key_id>')
    .description("An API key's share links (never their tokens)")
    .addOption(new Option('--state <state>', 'only links in this state').choices([...states]))
    .addHelpText('after', examples('kms api-keys shares 4c1d…'))
    .action(
      run<{ state?: (typeof states)[number] }, [string]>(async (opts, id) => {
        const { kms } = await connect(opts);
        const page = await kms.data(kms.api.GET('/api-keys/{key_id}/shares', { params: { path: { key_id: id }, query: { state: opts.state } } }));
        print(opts, page, () => table(page.items, SHARE_COLUMNS) + pagedFooter(page));
      }),
    );

  apiKeys
    .command('unshare <share_id>')
    .description('Revoke an API key share link')
    .addHelpText('after', examples('kms api-keys unshare 91aa…'))
    .action(
      run<object, [string]>(async (opts, id) => {
        const { kms } = await connect(opts);
        await kms.data(kms.api.DELETE('/api-keys/shares/{share_id}', { params: { path: { share_id: id } } }));
        print(opts, { revoked: id }, `revoked share ${id}`);
      }),
    );
}

export function registerShares(program: Command) {
  const shares = program.command('shares').description('Public key share links (they follow rotations)');
  shares.addHelpText('after', examples('kms shares create 8F3A… --expires-in-hours 48', 'kms shares list', 'kms shares get kms_ks_… | gpg --import'));

  shares
    .command('list')
    .description('Your public key shares with their view counts')
    .option('--fingerprint <fpr>', 'only shares of this key')
    .addOption(new Option('--state <state>', 'only shares in this state').choices([...states]))
    .option('--page <n>', 'page number', int('--page'), 1)
    .addHelpText('after', examples('kms shares list', 'kms shares list --state active --json'))
    .action(
      run<{ fingerprint?: string; state?: (typeof states)[number]; page: number }>(async (opts) => {
        const { kms } = await connect(opts);
        const page = await kms.data(kms.api.GET('/keys/share/', { params: { query: { fingerprint: opts.fingerprint, state: opts.state, page: opts.page } } }));
        print(opts, page, () => table(page.items, ['share_id', 'fingerprint', 'label', ...SHARE_COLUMNS.slice(1)]) + pagedFooter(page));
      }),
    );

  shares
    .command('create <fingerprint>')
    .description("Share a key's public key through a link; prints the link once")
    .option('--expires-in-hours <n>', 'link lifetime in hours', int('--expires-in-hours'))
    .option('--max-views <n>', 'views allowed (none: unlimited)', int('--max-views'))
    .option('--recipient-email <email>', 'mail the link and fingerprint to this address')
    .addHelpText('after', examples('kms shares create 8F3A…', 'kms shares create 8F3A… --recipient-email bob@example.com --max-views 3'))
    .action(
      run<{ expiresInHours?: number; maxViews?: number; recipientEmail?: string }, [string]>(async (opts, fingerprint) => {
        const { kms } = await connect(opts);
        const share = await kms.data(
          kms.api.POST('/keys/share/create', {
            body: { fingerprint, expires_in_hours: opts.expiresInHours, max_views: opts.maxViews, recipient_email: opts.recipientEmail },
          }),
        );
        print(opts, share, () => fields(share, ['share_id', 'fingerprint', 'url', 'share_token', 'expires_at', 'max_views']));
      }),
    );

  shares
    .command('revoke <share_id>')
    .description('Revoke a public key share at once')
    .addHelpText('after', examples('kms shares revoke 91aa…'))
    .action(
      run<object, [string]>(async (opts, id) => {
        const { kms } = await connect(opts);
        await kms.data(kms.api.DELETE('/keys/share/{share_id}', { params: { path: { share_id: id } } }));
        print(opts, { revoked: id }, `revoked share ${id}`);
      }),
    );

  shares
    .command('analytics')
    .description('Shares by state, views per day, most viewed keys, recent views')
    .addHelpText('after', examples('kms shares analytics --json'))
    .action(
      run(async (opts) => {
        const { kms } = await connect(opts);
        const stats = await kms.data(kms.api.GET('/keys/share/analytics', {}));
        print(opts, stats);
      }),
    );

  shares
    .command('get <share_token>')
    .description('The armored public key behind a share link (no login needed)')
    .addHelpText('after', examples('kms shares get kms_ks_… | gpg --import'))
    .action(
      run<object, [string]>(async (opts, token) => {
        const { kms } = await connect(opts, { auth: false });
        kms.token = undefined; // a public link: no credential goes with it
        const shared = await kms.data(kms.api.GET('/keys/share/{share_token}', { params: { path: { share_token: token } } }));
        print(opts, shared, () => (shared as { public_key: string }).public_key);
      }),
    );
}
