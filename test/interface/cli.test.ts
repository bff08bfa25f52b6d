import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, open, readFile, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { registerUser, startTestService, type TestService } from '../support/service';
import { createPgpHome, type PgpHome } from '../support/gpg';
import { startProxy } from '../support/proxy';

/**
 * The `kms` command line as a user runs it: a child process (cli/kms.mjs, the package.json bin) against
 * the real service, with its own HOME and XDG_CONFIG_HOME in a temporary folder.
 */
const BIN = fileURLToPath(new URL('../../cli/kms.mjs', import.meta.url));
let s: TestService;
let dir: string;
let home: string;
let pgp: PgpHome;
let user: Awaited<ReturnType<typeof registerUser>>;
let fingerprint: string;
const passphrase = 'a passphrase for the cli test';

interface Run {
  args: string[];
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `kms …` (cli/kms.mjs, or `bin`); `stdin` is written to its standard input, `fd3` to file descriptor 3. */
function kms(args: string[], opts: { env?: Record<string, string>; stdin?: string; fd3?: string; cwd?: string; bin?: string } = {}): Promise<Run> {
  const env: Record<string, string> = { PATH: process.env.PATH!, HOME: home, XDG_CONFIG_HOME: join(home, 'config'), KMS_URL: s.url, ...opts.env };
  return new Promise((resolve, reject) => {
    const child = spawn(opts.bin ?? process.execPath, opts.bin ? args : [BIN, ...args], { env, cwd: opts.cwd ?? dir, stdio: ['pipe', 'pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    child.on('error', reject);
    // A hung command fails its test with what it printed, instead of the test timing out blind.
    const timer = setTimeout(() => child.kill('SIGKILL'), 25_000);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ args, code: code ?? -1, stdout, stderr });
    });
    child.stdin.end(opts.stdin ?? '');
    const fd3 = child.stdio[3] as NodeJS.WritableStream;
    fd3.on('error', () => undefined);
    fd3.end(opts.fd3 ?? '');
  });
}

/** A terminal (tmux, 160x20) running `kms …` with the test's environment; `screen()` is what it shows. */
function terminal(args: string[], env: Record<string, string> = {}) {
  const socket = `kms-cli-${randomBytes(4).toString('hex')}`;
  const all = { HOME: home, XDG_CONFIG_HOME: join(home, 'config'), KMS_URL: s.url, PATH: process.env.PATH!, ...env };
  const command = `cd ${dir} && env ${Object.entries(all)
    .map(([k, v]) => `${k}='${v}'`)
    .join(' ')} '${process.execPath}' '${BIN}' ${args.join(' ')}; echo "exit $?"; sleep 60`;
  const tmux = (...a: string[]) => spawnSync('tmux', ['-L', socket, ...a], { encoding: 'utf8' });
  expect(tmux('new-session', '-d', '-x', '160', '-y', '20', command).status).toBe(0);
  const screen = () => tmux('capture-pane', '-p').stdout;
  return {
    screen,
    type: (text: string) => tmux('send-keys', '-l', text) && tmux('send-keys', 'Enter'),
    /** Waits until the screen matches (or 30 s have passed) and answers it. */
    async until(re: RegExp) {
      const deadline = Date.now() + 30_000;
      while (!re.test(screen()) && Date.now() < deadline) await sleep(100);
      return screen();
    },
    close: () => tmux('kill-server'),
  };
}

const ok = (r: Run) => {
  expect(r.code, `kms ${r.args.join(' ')}: exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`).toBe(0);
  return r;
};
const json = <T = any>(r: Run): T => JSON.parse(ok(r).stdout) as T;
const credentialsFile = () => join(home, 'config', 'kms', 'credentials.json');

beforeAll(async () => {
  s = await startTestService();
  dir = await mkdtemp(join(tmpdir(), 'kms-cli-'));
  home = join(dir, 'home');
  await mkdir(home);
  pgp = await createPgpHome();
  user = await registerUser(s.api);
});
afterAll(async () => {
  await s?.stop();
  await pgp?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

// Each test runs the CLI several times (node + tsx start-up each): generous limits for a busy 2-core machine.
describe('kms command line', { timeout: 90_000 }, () => {
  it('logs in (password on stdin), stores the session 0600 in XDG_CONFIG_HOME, and says who it is', async () => {
    const notYet = await kms(['whoami']);
    expect(notYet.code).toBe(3);
    expect(notYet.stderr).toContain('kms login');

    const login = json(await kms(['login', '-u', user.username, '--password-stdin', '--json'], { stdin: `${user.password}\n` }));
    expect(login).toMatchObject({ kind: 'session', username: user.username, credentials: credentialsFile() });
    expect((await stat(credentialsFile())).mode & 0o777).toBe(0o600);
    expect((await stat(join(home, 'config', 'kms'))).mode & 0o777).toBe(0o700);
    expect(JSON.parse(await readFile(credentialsFile(), 'utf8'))).toMatchObject({ kind: 'session', token: expect.any(String) });

    const me = ok(await kms(['whoami']));
    expect(me.stdout).toContain(user.username);

    const bad = await kms(['login', '-u', user.username, '--password-stdin'], { stdin: 'not the password at all\n' });
    expect(bad.code).toBe(3);
    expect(bad.stderr).toContain('invalid_credentials');
  });

  it('generates a v6 key by profile, and moves a key to another profile for its later rotations', async () => {
    const v6 = json(
      await kms(['keys', 'generate', '--label', 'cli-v6', '--name', 'V6', '--email', 'v6@example.test', '--profile', 'rfc9580', '--json'], {
        env: { KMS_PASSPHRASE: passphrase },
      }),
    );
    expect(v6).toMatchObject({ profile: 'rfc9580', rotation_profile: 'rfc9580' });
    expect(v6.fingerprint).toMatch(/^[0-9a-f]{64}$/);
    expect(ok(await kms(['keys', 'list'])).stdout).toContain('rfc9580');
    expect(json(await kms(['keys', 'schedule', v6.fingerprint, '--profile', 'rfc4880', '--json']))).toMatchObject({ profile: 'rfc4880' });
    const rotated = json(await kms(['keys', 'rotate', v6.fingerprint, '--profile', 'rfc9580', '--json']));
    expect(rotated).toMatchObject({ state: 'completed', result: { rotated: true, from_generation: 1 } });
    const bad = await kms(['keys', 'generate', '--label', 'x', '--name', 'X', '--email', 'x@example.test', '--profile', 'rfc2440'], {
      env: { KMS_PASSPHRASE: passphrase },
    });
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain('rfc9580');
  });

  it('generates a key, encrypts three files into a folder and decrypts them back (passphrase on fd 3)', async () => {
    const key = json(
      await kms(['keys', 'generate', '--label', 'cli', '--name', 'Cli User', '--email', 'cli@example.test', '--json'], { env: { KMS_PASSPHRASE: passphrase } }),
    );
    expect(key).toMatchObject({ label: 'cli', algorithm: 'curve25519', status: 'active' });
    fingerprint = key.fingerprint;
    expect(ok(await kms(['keys', 'list'])).stdout).toContain(fingerprint);

    const plain = [randomBytes(1 << 20), Buffer.from('two\n'), randomBytes(70_000)];
    const names = ['one.bin', 'two.txt', 'three.dat'];
    for (const [i, name] of names.entries()) await writeFile(join(dir, name), plain[i]);
    const enc = json(await kms(['encrypt', ...names, '--key', fingerprint, '--out', 'encrypted', '--json']));
    expect(enc.job.state).toBe('completed');
    expect((await readdir(join(dir, 'encrypted'))).sort()).toEqual(names.map((n) => `${n}.gpg`).sort());

    const dec = ok(
      await kms(['decrypt', ...names.map((n) => `encrypted/${n}.gpg`), '--key', fingerprint, '--passphrase-fd', '3', '--out', 'decrypted'], {
        fd3: `${passphrase}\n`,
      }),
    );
    expect(dec.stdout).toContain('decrypted 3 file(s)');
    for (const [i, name] of names.entries()) expect(Buffer.compare(await readFile(join(dir, 'decrypted', name)), plain[i])).toBe(0);

    // Not over existing files unless --force.
    const again = await kms(['decrypt', 'encrypted/two.txt.gpg', '--key', fingerprint, '--out', 'decrypted'], { env: { KMS_PASSPHRASE: passphrase } });
    expect(again.code).toBe(1);
    expect(again.stderr).toContain('output_exists');
    ok(await kms(['decrypt', 'encrypted/two.txt.gpg', '--key', fingerprint, '--out', 'decrypted', '--force'], { env: { KMS_PASSPHRASE: passphrase } }));
  });

  it('rotates a key and says what it made (generation and fingerprint), and exits non-zero with the reason when it cannot', async () => {
    const env = { KMS_PASSPHRASE: passphrase };
    const k = json(await kms(['keys', 'generate', '--label', 'rotated', '--name', 'R', '--email', 'r@example.test', '--json'], { env }));
    const r = ok(await kms(['keys', 'rotate', k.fingerprint]));
    const current = json(await kms(['keys', 'show', k.fingerprint, '--json'])).key;
    expect(current.generation).toBe(2);
    expect(r.stdout.trim()).toBe(`rotated: now generation 2, fingerprint ${current.fingerprint} (was generation 1, ${k.fingerprint})`);
    ok(await kms(['keys', 'disable', k.fingerprint]));
    const refused = await kms(['keys', 'rotate', k.fingerprint]);
    expect(refused.code).toBe(1);
    expect(refused.stdout).toBe('');
    expect(refused.stderr).toContain('key_disabled');
  });

  it('encrypts to a gpg public key, and gpg decrypts the result', async () => {
    await pgp.gpg(['--quick-generate-key', 'Peer <peer@example.test>', 'future-default', 'default', 'never'], { passphrase: '' });
    await pgp.put('peer.asc', (await pgp.gpg(['--export', '--armor', 'peer@example.test'])).stdout);
    const plain = randomBytes(300_000);
    await writeFile(join(dir, 'for-gpg.bin'), plain);
    for (const armor of [[], ['--armor']]) {
      const out = json(await kms(['encrypt', 'for-gpg.bin', '--public-key', pgp.file('peer.asc'), ...armor, '--out', `gpg${armor.length}`, '--json']));
      const decrypted = pgp.file(`from-kms-${armor.length}`);
      await pgp.gpg(['--decrypt', '-o', decrypted, join(dir, out.outputs[0].path)], { passphrase: '' });
      expect(Buffer.compare(await readFile(decrypted), plain)).toBe(0);
    }
  });

  it('signs files (gpg verifies), signs while encrypting to gpg, and decrypts with --verify-with', async () => {
    const plain = randomBytes(200_000);
    await writeFile(join(dir, 'signed.bin'), plain);
    const signed = json(await kms(['sign', 'signed.bin', '--key', fingerprint, '--armor', '--out', 'sigs', '--json'], { env: { KMS_PASSPHRASE: passphrase } }));
    expect(signed.outputs[0].path).toMatch(/signed\.bin\.asc$/);
    ok(await kms(['keys', 'public', fingerprint, '-o', pgp.file('ours.asc')]));
    await pgp.gpg(['--import', pgp.file('ours.asc')]);
    const verified = await pgp.gpg(['--status-fd', '2', '--verify', join(dir, signed.outputs[0].path), join(dir, 'signed.bin')]);
    expect(verified.stderr).toContain(`VALIDSIG ${fingerprint.toUpperCase()}`);

    const enc = json(
      await kms(
        ['encrypt', 'signed.bin', '--public-key', pgp.file('peer.asc'), '--sign-with', fingerprint, '--passphrase-fd', '3', '--out', 'signed-enc', '--json'],
        { fd3: `${passphrase}\n` },
      ),
    );
    const decrypted = pgp.file('signed-from-kms');
    const gpg = await pgp.gpg(['--status-fd', '2', '-o', decrypted, '--decrypt', join(dir, enc.outputs[0].path)], { passphrase: '' });
    expect(gpg.stderr).toContain(`VALIDSIG ${fingerprint.toUpperCase()}`);
    expect(Buffer.compare(await readFile(decrypted), plain)).toBe(0);

    // Encrypted to our key and signed by it: decrypted and verified; --require-signature needs --verify-with.
    const own = json(
      await kms(['encrypt', 'signed.bin', '--key', fingerprint, '--sign-with', fingerprint, '--out', 'own-signed', '--json'], {
        env: { KMS_PASSPHRASE: passphrase },
      }),
    );
    const dec = json(
      await kms(
        ['decrypt', own.outputs[0].path, '--key', fingerprint, '--verify-with', fingerprint, '--require-signature', '--out', 'own-verified', '--json'],
        { env: { KMS_PASSPHRASE: passphrase } },
      ),
    );
    expect(dec.job.result.signatures[0]).toMatchObject({ valid: true, signer_fingerprint: fingerprint });
    expect((await kms(['decrypt', own.outputs[0].path, '--key', fingerprint, '--require-signature'], { env: { KMS_PASSPHRASE: passphrase } })).code).toBe(2);

    // kms verify: our signature, then gpg's (invalid against our key: unknown signer, exit 1).
    const good = json(await kms(['verify', 'signed.bin', '--key', fingerprint, '--signature', signed.outputs[0].path, '--json']));
    expect(good.result.signatures[0]).toMatchObject({ valid: true, signer_fingerprint: fingerprint });
    await pgp.gpg(['-u', 'peer@example.test', '--detach-sign', '-o', pgp.file('peer.sig'), join(dir, 'signed.bin')], { passphrase: '' });
    const byPeer = await kms(['verify', 'signed.bin', '--key', fingerprint, '--signature', pgp.file('peer.sig')]);
    expect(byPeer.code).toBe(1);
    expect(byPeer.stdout).toContain('unknown_signer');
    expect(ok(await kms(['verify', 'signed.bin', '--public-key', pgp.file('peer.asc'), '--signature', pgp.file('peer.sig')])).stdout).toContain('true');
  });

  it('imports a gpg secret key and a partner public key (keys import)', async () => {
    await pgp.gpg(['--quick-generate-key', 'Imported <imported@example.test>', 'future-default', 'default', 'never'], { passphrase: 'gpg lock passphrase' });
    await pgp.put(
      'imported-secret.asc',
      (await pgp.gpg(['--export-secret-keys', '--armor', 'imported@example.test'], { passphrase: 'gpg lock passphrase' })).stdout,
    );
    const managed = json(
      await kms(['keys', 'import', pgp.file('imported-secret.asc'), '--label', 'imported', '--json'], {
        env: { KMS_PASSPHRASE: passphrase, KMS_KEY_PASSPHRASE: 'gpg lock passphrase' },
      }),
    );
    expect(managed).toMatchObject({ kind: 'managed', imported: true, label: 'imported' });
    const recipient = json(await kms(['keys', 'import', pgp.file('peer.asc'), '--label', 'partner', '--json']));
    expect(recipient).toMatchObject({ kind: 'recipient', imported: true });
    const wrong = await kms(['keys', 'import', pgp.file('imported-secret.asc'), '--label', 'again'], {
      env: { KMS_PASSPHRASE: passphrase, KMS_KEY_PASSPHRASE: 'not it' },
    });
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toContain('wrong_key_passphrase');
  });

  it('exits 1 with the code for a wrong passphrase, 2 for bad usage, 4 for a missing job, 5 once the passphrase limit is hit', async () => {
    const wrong = await kms(['decrypt', 'encrypted/two.txt.gpg', '--key', fingerprint, '--out', 'nowhere'], {
      env: { KMS_PASSPHRASE: 'certainly not the passphrase' },
    });
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toContain('wrong_passphrase');
    const asJson = await kms(['decrypt', 'encrypted/two.txt.gpg', '--key', fingerprint, '--out', 'nowhere', '--json'], {
      env: { KMS_PASSPHRASE: 'certainly not the passphrase' },
    });
    expect(JSON.parse(asJson.stderr)).toMatchObject({ error: { code: 'wrong_passphrase', status: 422, exit_code: 1 } });

    expect((await kms(['encrypt', 'two.txt'])).code).toBe(2); // neither --key nor --public-key
    expect((await kms(['keys', 'list', '--page', 'x'])).code).toBe(2);
    expect((await kms(['nonsense'])).code).toBe(2);
    const noPass = await kms(['decrypt', 'encrypted/two.txt.gpg', '--key', fingerprint]); // stdin is no terminal: no prompt
    expect(noPass.code).toBe(2);
    expect(noPass.stderr).toContain('KMS_PASSPHRASE');

    const missing = await kms(['jobs', 'show', '00000000-0000-4000-8000-000000000000']);
    expect(missing.code).toBe(4);

    // The per-key passphrase limit: the next wrong guess is 429 with a long Retry-After, not waited for.
    const limited = json(
      await kms(['keys', 'generate', '--label', 'limited', '--name', 'L', '--email', 'l@example.test', '--json'], { env: { KMS_PASSPHRASE: passphrase } }),
    );
    for (let i = 0; i < 10; i++) {
      const r = await s.api('POST', '/keys/decrypt', {
        token: user.token,
        form: { fingerprint: limited.fingerprint, passphrase: `wrong guess ${i}`, files: [{ name: 'x.gpg', data: Buffer.from('x') }] },
      });
      expect(r.status).toBe(422);
    }
    const hit = await kms(['decrypt', 'encrypted/two.txt.gpg', '--key', limited.fingerprint, '--out', 'nowhere'], {
      env: { KMS_PASSPHRASE: 'one more wrong guess' },
    });
    expect(hit.code).toBe(5);
    expect(hit.stderr).toContain('rate_limited');
  });

  it('exits 3 once the session has ended (POST /auth/logout with its token), and KMS_API_KEY wins over the stored login', async () => {
    const { token } = JSON.parse(await readFile(credentialsFile(), 'utf8')) as { token: string };
    expect((await s.api('POST', '/auth/logout', { token })).status).toBe(200);
    const ended = await kms(['keys', 'list']);
    expect(ended.code).toBe(3);
    expect(ended.stderr).toContain('token_revoked');

    const viaKey = ok(await kms(['whoami', '--json'], { env: { KMS_API_KEY: user.apiKey } }));
    expect(JSON.parse(viaKey.stdout)).toMatchObject({ username: user.username, credential: 'KMS_API_KEY' });
    // A stored login is never sent to another service URL.
    const elsewhere = await kms(['keys', 'list'], { env: { KMS_URL: 'http://127.0.0.1:9/api/v1' } });
    expect(elsewhere.code).toBe(3);
    expect(elsewhere.stderr).toContain('not http://127.0.0.1:9');

    json(await kms(['login', '-u', user.username, '--password-stdin', '--json'], { stdin: user.password }));
    ok(await kms(['keys', 'list']));
    ok(await kms(['logout']));
    expect((await kms(['keys', 'list'])).code).toBe(3);
    json(await kms(['login', '--api-key', '--json'], { stdin: `${user.apiKey}\n` }));
    expect(JSON.parse(await readFile(credentialsFile(), 'utf8'))).toMatchObject({ kind: 'api_key' });
    ok(await kms(['keys', 'show', fingerprint]));
  });

  it('submits without downloading, then waits for and downloads the job; follows events', async () => {
    json(await kms(['login', '-u', user.username, '--password-stdin', '--json'], { stdin: user.password }));
    const events = spawn(process.execPath, [BIN, 'events', '--types', 'keys.generated', '--json'], {
      env: { PATH: process.env.PATH!, HOME: home, XDG_CONFIG_HOME: join(home, 'config'), KMS_URL: s.url },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let seen = '';
    events.stdout.on('data', (c: Buffer) => (seen += c.toString()));
    try {
      await sleep(1500); // connected (node and tsx start first)
      const submitted = json(await kms(['encrypt', 'two.txt', '--key', fingerprint, '--no-download', '--json']));
      expect(submitted.outputs).toEqual([]);
      const jobId = submitted.job.job_id as string;
      expect(json(await kms(['jobs', 'wait', jobId, '--json']))).toMatchObject({ job_id: jobId, state: 'completed' });
      expect(ok(await kms(['jobs', 'show', jobId])).stdout).toContain('two.txt.gpg');
      const got = json(await kms(['jobs', 'download', jobId, '--out', 'later', '--json']));
      expect(got.outputs[0].path).toBe(join('later', 'two.txt.gpg'));
      expect((await stat(join(dir, 'later', 'two.txt.gpg'))).size).toBeGreaterThan(0);

      const made = json(
        await kms(['keys', 'generate', '--label', 'evented', '--name', 'E', '--email', 'e@example.test', '--json'], { env: { KMS_PASSPHRASE: passphrase } }),
      );
      const deadline = Date.now() + 10_000;
      while (!seen.includes(made.fingerprint) && Date.now() < deadline) await sleep(50);
      const line = seen.split('\n').find((l) => l.includes(made.fingerprint));
      expect(line && JSON.parse(line)).toMatchObject({ type: 'keys.generated', account: user.id });
    } finally {
      events.kill('SIGINT');
    }
  });

  it('manages API keys (a scoped key works within its scopes only) and public key shares', { timeout: 120_000 }, async () => {
    const created = json(await kms(['api-keys', 'create', '--name', 'reader', '--scope', 'keys:read', '--json']));
    expect(created).toMatchObject({ name: 'reader', scopes: ['keys:read'], value: expect.stringMatching(/^kms_sk_/) });
    expect(ok(await kms(['api-keys', 'list'])).stdout).toContain('reader');
    const asReader = { KMS_API_KEY: created.value as string };
    expect(ok(await kms(['keys', 'list'], { env: asReader })).stdout).toContain(fingerprint);
    const denied = await kms(['encrypt', 'two.txt', '--key', fingerprint, '--out', 'denied'], { env: asReader });
    expect(denied.code).toBe(3);
    expect(denied.stderr).toContain('insufficient_scope');
    ok(await kms(['api-keys', 'revoke', created.key_id]));
    const revoked = await kms(['keys', 'list'], { env: asReader });
    expect(revoked.code).toBe(3);
    expect(revoked.stderr).toContain('api_key_revoked');
    // Every scope the service has is a choice (the client's list: client/scopes.ts).
    const signer = json(await kms(['api-keys', 'create', '--name', 'signer', '--scope', 'crypto:sign', '--scope', 'crypto:verify', '--json']));
    expect(signer.scopes).toEqual(['crypto:sign', 'crypto:verify']);
    ok(await kms(['api-keys', 'revoke', signer.key_id]));

    const share = json(await kms(['shares', 'create', fingerprint, '--max-views', '2', '--json']));
    expect(share.share_token).toMatch(/^kms_ks_/);
    expect(ok(await kms(['shares', 'list'])).stdout).toContain(share.share_id);
    expect(ok(await kms(['shares', 'get', share.share_token])).stdout).toContain('BEGIN PGP PUBLIC KEY BLOCK');
    ok(await kms(['shares', 'revoke', share.share_id]));
    expect((await kms(['shares', 'get', share.share_token])).code).toBe(4); // 410 share_revoked
  });

  it('registers a new account and is logged in as it', async () => {
    const other = join(dir, 'other-home');
    await mkdir(other);
    const name = `cli_${randomBytes(4).toString('hex')}`;
    const env = { HOME: other, XDG_CONFIG_HOME: join(other, 'config') };
    const made = json(
      await kms(['register', '-u', name, '--email', `${name}@example.test`, '--json'], { env: { ...env, KMS_PASSWORD: 'a long enough password' } }),
    );
    expect(made).toMatchObject({ username: name, partner_api_key: { api_key: expect.stringMatching(/^kms_pk_/) } });
    expect(json(await kms(['whoami', '--json'], { env }))).toMatchObject({ username: name });
    const taken = await kms(['register', '-u', name, '--email', `${name}@example.test`], { env: { ...env, KMS_PASSWORD: 'a long enough password' } });
    expect(taken.code).toBe(1);
    expect(taken.stderr).toMatch(/\[[a-z_]+\]|\([a-z_]+\)/);
  });

  it('resumes an upload cut by a network drop with the same Idempotency-Key: one job, completed', async () => {
    const api = new URL(s.url);
    const proxy = await startProxy(api.hostname, Number(api.port));
    try {
      const size = 48 << 20;
      const file = join(dir, 'dropped.bin');
      const fh = await open(file, 'w');
      await fh.truncate(size); // zeros: enough to upload, cheap to make
      await fh.close();
      const jobsBefore = Number((await s.c.db('jobs').where({ user_id: user.id }).count({ n: '*' }).first())!.n);
      const key = `cli-drop-${randomBytes(4).toString('hex')}`;
      const run = kms(['encrypt', 'dropped.bin', '--key', fingerprint, '--out', 'dropped', '--idempotency-key', key, '--json'], {
        // The stored login belongs to the service's own URL and is not sent elsewhere: the key goes by environment.
        env: { KMS_URL: `http://127.0.0.1:${proxy.port}/api/v1`, KMS_API_KEY: user.apiKey },
      });
      let ended: Run | undefined;
      void run.then((r) => (ended = r));
      const started = Date.now();
      while (proxy.bytesFromClients() < 8 << 20) {
        if (ended) throw new Error(`kms ended before the cut: ${JSON.stringify(ended)}`);
        if (Date.now() - started > 30_000) throw new Error('the upload did not start');
        await sleep(5);
      }
      proxy.cut();
      await sleep(150);
      proxy.restore();
      const result = await run;
      const out = json(result);
      expect(result.stderr).toMatch(/retrying/);
      expect(out.job.state).toBe('completed');
      expect((await stat(join(dir, 'dropped', 'dropped.bin.gpg'))).size).toBeGreaterThan(size);
      const rows = await s.c.db('jobs').where({ user_id: user.id, idempotency_key: key });
      expect(rows).toHaveLength(1);
      expect(rows[0].state).toBe('completed');
      // The cut try had started its job (jobs run while their upload arrives): it failed and let go of the key.
      const all = await s.c.db('jobs').where({ user_id: user.id }).orderBy('created_at');
      expect(all.slice(jobsBefore).map((j) => [j.state, j.error?.code ?? null])).toEqual([
        ['failed', 'upload_interrupted'],
        ['completed', null],
      ]);
    } finally {
      await proxy.close();
    }
  }, 120_000);

  it('shows a progress bar on a terminal (tmux) mid-transfer of a 512 MiB file, and none when piped', async () => {
    const file = join(dir, 'big.bin');
    const fh = await open(file, 'w');
    await fh.truncate(512 << 20);
    await fh.close();
    const term = terminal(['encrypt', 'big.bin', '--key', fingerprint, '--out', 'big-out']);
    try {
      let screen = '';
      let bar: RegExpMatchArray | null = null;
      const deadline = Date.now() + 60_000;
      while (!bar && Date.now() < deadline) {
        await sleep(100);
        screen = term.screen();
        // Mid-transfer, once there is a speed to tell.
        bar = screen.match(/(upload|processing|download)\s*\|[█░]+\|\s*(\d+)% \| [\d.]+ MiB \/ 512\.0 MiB \| [\d.]+ MiB\/s \| ETA \d+:\d\d/);
        if (bar && (Number(bar[2]) === 0 || Number(bar[2]) === 100)) bar = null;
      }
      expect(bar, `no progress bar seen; the pane showed:\n${screen}`).not.toBeNull();
    } finally {
      term.close();
    }
    // Piped (not a terminal): no bar, no control characters.
    const piped = ok(await kms(['encrypt', 'two.txt', '--key', fingerprint, '--out', 'piped']));
    // eslint-disable-next-line no-control-regex -- the assertion is that no ANSI escape (ESC [) reaches a pipe
    expect(piped.stderr).not.toMatch(/[█░]|\x1b\[/);
  }, 120_000);

  it('refuses what it can before any upload or second prompt: an existing output (naming --force), a short new password, a malformed fingerprint or job id (exit 2)', async () => {
    const jobs = async () => Number((await s.c.db('jobs').where({ user_id: user.id }).count({ n: '*' }).first())!.n);
    const before = await jobs();
    for (const args of [
      ['encrypt', 'two.txt', '--key', fingerprint, '--out', 'encrypted'],
      ['encrypt', 'two.txt', 'one.bin', '--key', fingerprint, '--out', 'encrypted', '--json'],
    ]) {
      const exists = await kms(args);
      expect(exists.code).toBe(1);
      expect(exists.stderr).toContain('output_exists');
      expect(exists.stderr).toContain(`${join('encrypted', 'two.txt.gpg')} exists (use --force to replace it)`);
      expect(exists.stderr).not.toContain('overwrite');
    }
    expect(await jobs()).toBe(before); // nothing was uploaded
    ok(await kms(['encrypt', 'two.txt', '--key', fingerprint, '--out', 'encrypted', '--force']));
    // An armored output has another name: it does not exist yet.
    ok(await kms(['encrypt', 'two.txt', '--key', fingerprint, '--out', 'encrypted', '--armor']));

    // Malformed ids are usage errors before any request; a fingerprint as gpg prints it is fine.
    for (const args of [
      ['jobs', 'show', 'not-a-job'],
      ['jobs', 'wait', '1234'],
      ['jobs', 'download', 'x'],
      ['keys', 'show', 'abc'],
      ['keys', 'rotate', `${fingerprint}00`],
      ['encrypt', 'two.txt', '--key', 'zz'],
      ['decrypt', 'x.gpg', '--key', 'nope'],
      ['shares', 'create', 'short'],
    ]) {
      const bad = await kms(args);
      expect(bad.code, `kms ${args.join(' ')}: ${bad.stderr}`).toBe(2);
      expect(bad.stderr).toMatch(/40 hexadecimal digits|UUID/);
    }
    const spaced = fingerprint
      .toUpperCase()
      .replace(/(.{4})/g, '$1 ')
      .trim();
    expect(ok(await kms(['keys', 'show', spaced])).stdout).toContain(fingerprint);

    // A new password below the service's minimum: refused at once, from any source, with no account made.
    const { Password } = await import('../../api/schemas/common');
    const { Passphrase } = await import('../../api/schemas/key-fields');
    const { MIN_SECRET_LENGTH } = await import('../../cli/secrets');
    for (const schema of [Password, Passphrase]) {
      expect(schema.safeParse('x'.repeat(MIN_SECRET_LENGTH - 1)).success).toBe(false);
      expect(schema.safeParse('x'.repeat(MIN_SECRET_LENGTH)).success).toBe(true);
    }
    const name = `cli_${randomBytes(4).toString('hex')}`;
    const short = await kms(['register', '-u', name, '--email', `${name}@example.test`], { env: { KMS_PASSWORD: 'too short' } });
    expect(short.code).toBe(2);
    expect(short.stderr).toContain('at least 12 characters');
    expect(await s.c.db('users').where({ username: name }).first()).toBeUndefined();
    // At the prompt: refused after the first entry, without asking for it again.
    const term = terminal(['register', '-u', name, '--email', `${name}@example.test`], {
      HOME: join(dir, 'short-home'),
      XDG_CONFIG_HOME: join(dir, 'short-home', 'config'),
    });
    try {
      await term.until(/New password/);
      term.type('too short');
      const screen = await term.until(/exit \d+/);
      expect(screen).toContain('at least 12 characters');
      expect(screen).not.toContain('Repeat');
      expect(screen).toContain('exit 2');
    } finally {
      term.close();
    }
  });

  it('refuses an existing output before any upload, for every command that writes files (naming --force), and replaces it with --force', async () => {
    const jobs = async () => Number((await s.c.db('jobs').where({ user_id: user.id }).count({ n: '*' }).first())!.n);
    await mkdir(join(dir, 'exists'), { recursive: true });
    const outputs = ['two.txt', 'two.txt.sig', 'two.txt.gpg', 'public.asc', 'audit.ndjson'];
    for (const name of outputs) await writeFile(join(dir, 'exists', name), 'kept\n');
    const before = await jobs();
    const env = { KMS_PASSPHRASE: passphrase };
    for (const [args, output] of [
      [['decrypt', 'encrypted/two.txt.gpg', '--key', fingerprint, '--out', 'exists'], 'two.txt'],
      [['decrypt', 'encrypted/one.bin.gpg', 'encrypted/two.txt.gpg', '--key', fingerprint, '--out', 'exists', '--json'], 'two.txt'],
      [['sign', 'two.txt', '--key', fingerprint, '--out', 'exists'], 'two.txt.sig'],
      [['rewrap', 'encrypted/two.txt.gpg', '--key', fingerprint, '--out', 'exists'], 'two.txt.gpg'],
      [['encrypt', 'two.txt', '--key', fingerprint, '--out', 'exists'], 'two.txt.gpg'],
      [['keys', 'public', fingerprint, '-o', 'exists/public.asc'], 'public.asc'],
      [['audit', 'export', '-o', 'exists/audit.ndjson'], 'audit.ndjson'],
    ] as const) {
      const r = await kms([...args], { env });
      expect(r.code, `kms ${args.join(' ')}: ${r.stderr}`).toBe(1);
      expect(r.stderr).toContain('output_exists');
      expect(r.stderr).toContain(`${join('exists', output)} exists (use --force to replace it)`);
      expect(await jobs(), `kms ${args.join(' ')} uploaded`).toBe(before);
    }
    for (const name of outputs) expect(await readFile(join(dir, 'exists', name), 'utf8')).toBe('kept\n');
    expect((await readdir(join(dir, 'exists'))).sort()).toEqual([...outputs].sort()); // and nothing else written (one.bin)

    ok(await kms(['decrypt', 'encrypted/two.txt.gpg', '--key', fingerprint, '--out', 'exists', '--force'], { env }));
    expect(await readFile(join(dir, 'exists', 'two.txt'), 'utf8')).toBe('two\n');
    ok(await kms(['keys', 'public', fingerprint, '-o', 'exists/public.asc', '--force']));
    expect(await readFile(join(dir, 'exists', 'public.asc'), 'utf8')).toContain('BEGIN PGP PUBLIC KEY BLOCK');
  });

  it('draws a known total as bar, bytes, speed and time left; an unknown total (a followed download) as bytes and speed only', async () => {
    const { progressLine } = await import('../../cli/progress');
    const MiB = 1 << 20;
    expect(progressLine({ phase: 'upload', bytes_done: 64 * MiB, bytes_total: 256 * MiB }, 32 * MiB)).toBe(
      `upload     |${'█'.repeat(8)}${'░'.repeat(22)}| 25% | 64.0 MiB / 256.0 MiB | 32.0 MiB/s | ETA 0:06`,
    );
    expect(progressLine({ phase: 'download', bytes_done: 5 * MiB, file: 'big.bin.gpg' }, 2.5 * MiB)).toBe('download   5.0 MiB | 2.5 MiB/s big.bin.gpg');
    // No speed measured yet: none shown, and no guess at the time left.
    expect(progressLine({ phase: 'processing', bytes_done: 0, bytes_total: 2 * MiB }, undefined)).toMatch(/0% \| 0 B \/ 2\.0 MiB \| - MiB\/s \| ETA -:--$/);
    expect(progressLine({ phase: 'upload', bytes_done: 3600 * 10 * MiB, bytes_total: 3600 * 20 * MiB }, 2 * MiB)).toMatch(/ETA 5:00:00$/);
  });

  it('ends the upload bar at 100% on a terminal (tmux)', async () => {
    const file = join(dir, 'full.bin');
    const fh = await open(file, 'w');
    await fh.truncate(24 << 20);
    await fh.close();
    const term = terminal(['encrypt', 'full.bin', '--key', fingerprint, '--out', 'full-out']);
    try {
      const screen = await term.until(/exit \d+/);
      expect(screen).toContain('exit 0');
      expect(screen, screen).toMatch(/upload\s*\|█+\|\s*100% \| 24\.0 MiB \/ 24\.0 MiB \| [\d.]+ MiB\/s \| ETA 0:00/);
      expect(screen).toMatch(/^job [0-9a-f-]{36}$/m);
    } finally {
      term.close();
    }
  });

  it('covers the account: audit (with its filters), profile, org members and invitations, password change, forgot and reset', async () => {
    const ann = await registerUser(s.api);
    const annHome = join(dir, 'ann-home');
    await mkdir(annHome);
    const env = { HOME: annHome, XDG_CONFIG_HOME: join(annHome, 'config') };
    json(await kms(['login', '-u', ann.username, '--password-stdin', '--json'], { env, stdin: ann.password }));

    expect(json(await kms(['profile', 'show', '--json'], { env }))).toMatchObject({ user_id: ann.id, username: ann.username, email: ann.email });
    expect(json(await kms(['profile', 'update', '--company', 'Cli Co', '--json'], { env }))).toMatchObject({ company_name: 'Cli Co' });
    expect(ok(await kms(['profile', 'show'], { env })).stdout).toContain('Cli Co');
    expect(json(await kms(['profile', 'update', '--no-company', '--json'], { env }))).toMatchObject({ company_name: null });
    expect((await kms(['profile', 'update'], { env })).code).toBe(2);

    const logins = json(await kms(['audit', '--action', 'sessions.*', '--status', 'success', '--page-size', '5', '--json'], { env }));
    expect(logins).toMatchObject({ page: 1, page_size: 5 });
    expect(logins.items.map((e: { action: string }) => e.action)).toContain('sessions.login');
    expect(logins.items.every((e: { action: string; status: string }) => e.action.startsWith('sessions.') && e.status === 'success')).toBe(true);
    expect(ok(await kms(['audit'], { env })).stdout).toMatch(/created_at\s+action\s+status/);
    expect((await kms(['audit', '--status', 'maybe'], { env })).code).toBe(2);

    expect(json(await kms(['org', 'show', '--json'], { env }))).toMatchObject({ role: 'owner', member_count: 1 });
    const members = json(await kms(['org', 'members', '--json'], { env }));
    expect(members.items).toEqual([expect.objectContaining({ user_id: ann.id, username: ann.username, role: 'owner' })]);
    expect(json(await kms(['org', 'invitations', '--state', 'pending', '--json'], { env }))).toMatchObject({ items: [], total: 0 });

    // A change keeps this login (the stored session is replaced) and the new password logs in.
    const second = 'the second password of ann';
    const changed = json(await kms(['password', 'change', '--json'], { env: { ...env, KMS_PASSWORD: ann.password, KMS_NEW_PASSWORD: second } }));
    expect(changed).toMatchObject({ status: 'password_changed', stored: true });
    expect(json(await kms(['whoami', '--json'], { env }))).toMatchObject({ username: ann.username });
    expect((await s.api('POST', '/auth/login', { body: { identifier: ann.username, password: second } })).status).toBe(200);
    const wrong = await kms(['password', 'change'], { env: { ...env, KMS_PASSWORD: 'not the current one', KMS_NEW_PASSWORD: 'a third password here' } });
    expect(wrong.code).not.toBe(0);

    // Forgot, then reset with the mailed token (the test service writes mail into MAIL_DIR).
    expect(json(await kms(['password', 'forgot', '--email', ann.email, '--json'], { env }))).toMatchObject({ status: 'accepted' });
    let token: string | undefined;
    const deadline = Date.now() + 15_000;
    while (!token && Date.now() < deadline) {
      await sleep(100);
      for (const f of await readdir(s.env.MAIL_DIR).catch(() => [] as string[])) {
        const mail = await readFile(join(s.env.MAIL_DIR, f), 'utf8');
        if (mail.includes(ann.email)) token ??= /Reset token: (\S+)/.exec(mail)?.[1];
      }
    }
    expect(token, 'no reset mail').toBeDefined();
    const third = 'the third password of ann';
    const reset = json(await kms(['password', 'reset', '--token', token!, '--json'], { env: { ...env, KMS_NEW_PASSWORD: third } }));
    expect(reset).toMatchObject({ status: 'password_reset' });
    json(await kms(['login', '-u', ann.username, '--password-stdin', '--json'], { env, stdin: third }));
    const reused = await kms(['password', 'reset', '--token', token!], { env: { ...env, KMS_NEW_PASSWORD: 'a fourth password here' } });
    expect(reused.code).not.toBe(0);
  });

  it(
    'installs on its own: `npm pack` in cli/ then `npm install -g` of the tarball gives a `kms` that works outside the checkout',
    { timeout: 180_000 },
    async () => {
      const place = await mkdtemp(join(tmpdir(), 'kms-cli-install-'));
      try {
        const npm = (args: string[], cwd: string) => {
          const r = spawnSync('npm', args, {
            cwd,
            encoding: 'utf8',
            env: { ...process.env, npm_config_audit: 'false', npm_config_fund: 'false', npm_config_update_notifier: 'false' },
          });
          expect(r.status, `npm ${args.join(' ')}\n${r.stdout}\n${r.stderr}`).toBe(0);
          return r.stdout;
        };
        const [packed] = JSON.parse(npm(['pack', '--json', '--pack-destination', place], fileURLToPath(new URL('../../cli/', import.meta.url)))) as {
          name: string;
          filename: string;
          files: { path: string }[];
        }[];
        expect(packed.name).toBe('@kms/cli');
        expect(packed.files.map((f) => f.path).sort()).toEqual(['dist/kms.js', 'package.json']);
        // Its dependencies come from the npm cache where it has them.
        npm(['install', '-g', '--prefix', join(place, 'global'), '--prefer-offline', join(place, packed.filename)], place);
        const installed = { bin: join(place, 'global', 'bin', 'kms'), cwd: place, env: { HOME: place, XDG_CONFIG_HOME: join(place, 'config') } };
        expect(ok(await kms(['--version'], installed)).stdout.trim()).toBe('0.1.0');
        json(await kms(['login', '-u', user.username, '--password-stdin', '--json'], { ...installed, stdin: user.password }));
        expect(json(await kms(['whoami', '--json'], installed))).toMatchObject({ username: user.username });
        expect((await kms(['jobs', 'show', 'nope'], installed)).code).toBe(2);
      } finally {
        await rm(place, { recursive: true, force: true });
      }
    },
  );
});
