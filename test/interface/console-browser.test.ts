import { afterAll, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { BrowserContext, Page } from 'playwright-core';
import { ManualClockFollowingTime, withClockAhead, type TestService } from '../support/service';
import { openChromium, screenshot, startOnLocalhost } from '../support/browser';
import { startSmtpServer } from '../support/smtp';
import { createPgpHome } from '../support/gpg';
import { buildConsole } from '../../scripts/build-console.mjs';

/**
 * The web console end to end in Debian's Chromium against the real service (API, workers, SMTP): the
 * console is built into a temporary folder first, as `npm run build` does. Every page visited is
 * checked with axe-core (no serious or critical violation); a failing test leaves a screenshot in
 * test-artifacts/ (gitignored).
 */
const AXE = await readFile(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;
let origin: string;
let work: string;
let context: BrowserContext;

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), 'kms-console-'));
  await buildConsole(join(work, 'console'));
  smtp = await startSmtpServer();
  ({ s, origin } = await startOnLocalhost((origin) => ({
    WEBAUTHN_ORIGINS: origin,
    CONSOLE_DIR: join(work, 'console'),
    SMTP_URL: smtp.url,
    QUEUE_DASHBOARD: 'read-only',
  })));
  context = await openChromium(join(work, 'profile'), { viewport: { width: 1100, height: 1000 }, acceptDownloads: true });
});
afterAll(async () => {
  await context?.close();
  await s?.stop();
  await smtp?.close();
  if (work) await rm(work, { recursive: true, force: true });
});

/** A fresh page whose script errors, CSP violations and failed requests are collected. */
async function open(name: string, { signedOut = true } = {}) {
  if (signedOut) await context.clearCookies();
  const page = await context.newPage();
  const problems: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(e.message));
  onTestFailed(async () => {
    await screenshot(page, `console-${name}`).catch(() => undefined);
  });
  return { page, problems };
}

/** axe-core in the page (evaluated through the DevTools protocol, which the page's CSP does not govern). */
async function accessible(page: Page): Promise<void> {
  await page.evaluate(AXE);
  // A string: the test's TypeScript has no DOM types; this runs in the page.
  const violations = await page.evaluate<string[]>(`axe.run().then((r) => r.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => v.id + ': ' + v.nodes.map((n) => n.target.join(' ')).join(', ')))`);
  expect(violations, `axe on ${page.url()}`).toEqual([]);
}

async function signIn(page: Page, identifier: string, password: string) {
  await page.goto(`${origin}/sign-in`);
  await page.getByLabel('Username or email').fill(identifier);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in', exact: true }).click();
  await expect.poll(() => page.url()).toBe(`${origin}/keys`);
}

const says = (page: Page, text: string | RegExp) => expect.poll(() => page.locator('main').innerText(), { timeout: 15_000 }).toMatch(text);

describe('the web console in Chromium', { timeout: 90_000 }, () => {
  it('serves its shell with the strict CSP at / and at the emailed paths; other paths stay 404 JSON', async () => {
    for (const path of ['/', '/reset-password', '/confirm-email', '/accept-invitation', '/keys']) {
      const res = await fetch(origin + path);
      expect(res.status, path).toBe(200);
      expect(res.headers.get('content-type')).toMatch(/text\/html/);
      const csp = res.headers.get('content-security-policy')!;
      expect(csp).toMatch(/script-src 'self';/);
      expect(csp).toMatch(/frame-ancestors 'none'/);
      expect(csp).not.toMatch(/unsafe-inline|unsafe-eval/);
    }
    const js = await fetch(`${origin}/console/app.js`);
    expect(js.headers.get('content-security-policy')).toMatch(/default-src 'none'/);
    expect(js.headers.get('content-encoding')).toBe('gzip');
    expect((await js.text()).length).toBeGreaterThan(10_000);
    expect((await fetch(`${origin}/nothing-here`)).status).toBe(404);
  });

  it('refuses a state change signed in by the cookie without the console header, and from another origin', async () => {
    const reg = await s.api('POST', '/partners/register', {
      body: { username: 'cookie-user', email: 'cookie@example.test', password: 'a long enough password' },
    });
    const token = reg.body.session.token as string;
    const set = await fetch(`${s.url}/auth/session`, { method: 'POST', headers: { authorization: `Bearer ${token}` } });
    expect(set.status).toBe(200);
    const cookie = set.headers.get('set-cookie')!;
    expect(cookie).toMatch(/^kms_session=/);
    expect(cookie).toMatch(/httponly/i);
    expect(cookie).toMatch(/samesite=strict/i);
    const jar = cookie.split(';')[0];
    const body = JSON.stringify({ rotation_interval_days: 30 });
    const json = { cookie: jar, 'content-type': 'application/json' };
    // A read needs no header; a change without it is refused, and so is one from another origin.
    expect((await fetch(`${s.url}/auth/me`, { headers: { cookie: jar } })).status).toBe(200);
    const bare = await fetch(`${s.url}/profile/update-rotation-days`, { method: 'POST', headers: json, body });
    expect(bare.status).toBe(403);
    expect(await bare.json()).toMatchObject({ code: 'console_header_missing' });
    const foreign = await fetch(`${s.url}/profile/update-rotation-days`, {
      method: 'POST',
      headers: { ...json, 'x-kms-console': '1', origin: 'https://evil.example' },
      body,
    });
    expect(foreign.status, JSON.stringify(await foreign.clone().json())).toBe(403);
    expect(await foreign.json()).toMatchObject({ code: 'cross_origin_request' });
    const good = await fetch(`${s.url}/profile/update-rotation-days`, { method: 'POST', headers: { ...json, 'x-kms-console': '1', origin }, body });
    expect(good.status).toBe(200);
    // The cookie holds session tokens only: an API key in it is not accepted.
    const key = reg.body.partner_api_key.api_key as string;
    expect((await fetch(`${s.url}/auth/me`, { headers: { cookie: `kms_session=${key}` } })).status).toBe(401);
    // Bearer requests are unchanged (no header needed).
    expect((await s.api('POST', '/profile/update-rotation-days', { token, body: { rotation_interval_days: 40 } })).status).toBe(200);
  });

  it('register → sign in → generate a key → encrypt two files → download → decrypt → audit rows and live job events', async () => {
    const { page, problems } = await open('files');
    await page.goto(origin + '/');
    await expect.poll(() => page.url()).toBe(`${origin}/sign-in`);
    await accessible(page);

    await page.getByRole('link', { name: 'Register a partner account' }).click();
    await page.getByLabel('Username').fill('console-user');
    await page.getByLabel('Email').fill('console-user@example.test');
    await page.getByLabel('Password').fill('console password 123');
    await accessible(page);
    await page.getByRole('button', { name: 'Register' }).click();
    await says(page, /only time the key is shown/);
    expect(await page.locator('#partner-key').innerText()).toMatch(/^kms_pk_/);
    await accessible(page);
    await page.getByRole('button', { name: /I stored it/ }).click();
    await says(page, /No keys yet/);

    // Sign out, then in with the password; a reload keeps the session, and nothing is stored in script reach.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await expect.poll(() => page.url()).toBe(`${origin}/sign-in`);
    await page.getByLabel('Username or email').fill('console-user@example.test');
    await page.getByLabel('Password').fill('wrong password here');
    await page.getByRole('button', { name: 'Sign in', exact: true }).click();
    await says(page, /password/i);
    await expect.poll(() => page.getByRole('alert').innerText()).toMatch(/\.$/);
    await page.getByLabel('Password').fill('console password 123');
    await page.getByRole('button', { name: 'Sign in', exact: true }).click();
    await expect.poll(() => page.url()).toBe(`${origin}/keys`);
    await page.reload();
    await says(page, /Generate a key/);
    expect(await page.evaluate('[localStorage.length, sessionStorage.length, document.cookie]')).toEqual([0, 0, '']);
    await accessible(page);

    // A curve25519 key, at once.
    await page.getByLabel('Key label').fill('console key');
    await page.getByLabel('Name in the key').fill('Console User');
    await page.getByLabel('Email in the key').fill('console-user@example.test');
    await page.getByLabel('Passphrase', { exact: true }).fill('key passphrase 123');
    await page.getByRole('button', { name: 'Generate' }).click();
    await says(page, /Key "console key" generated\./);
    await expect.poll(() => page.locator('table:not(.visually-hidden) tbody tr').count()).toBe(1);
    const download = page.waitForEvent('download');
    await page.getByRole('button', { name: 'Public key (.asc) of console key' }).click();
    expect(await readFile(await (await download).path(), 'utf8')).toMatch(/^-----BEGIN PGP PUBLIC KEY BLOCK-----/);

    // Its lifecycle: schedule, rotation (a job) and its history, generations, a share link.
    await page.getByRole('button', { name: 'Details of console key' }).click();
    await page.getByLabel(/Rotate every/).fill('30');
    await page.getByRole('button', { name: 'Set the schedule' }).click();
    await says(page, /Next rotation .* \(interval\)\./);
    await page.getByLabel(/Next generations \(v4 now\)/).selectOption('rfc9580');
    await page.getByRole('button', { name: 'Set the key type' }).click();
    await says(page, /Rotations from now on make v6 generations\./);
    // Rotation asks first, and says what it ends: dismissed, nothing happens; accepted, a v6 generation.
    page.once('dialog', (d) => void d.dismiss());
    await page.getByRole('button', { name: 'Rotate console key now' }).click();
    await expect.poll(() => page.locator('tbody tr[data-fingerprint]').first().innerText()).toMatch(/v4/);
    page.on('dialog', (d) => {
      expect(d.message()).toMatch(/new v6 generation encrypts from now on; generation 1 still decrypts/);
      void d.accept();
    });
    await page.getByRole('button', { name: 'Rotate console key now' }).click();
    await says(page, /console key rotated\./);
    await page.getByRole('button', { name: 'Details of console key' }).click();
    await expect.poll(() => page.locator('table.generations tbody tr').count()).toBe(2);
    await expect.poll(() => page.locator('ul.history').innerText()).toMatch(/generation 1 → .*manual, succeeded/);
    await expect.poll(() => page.locator('tbody tr[data-fingerprint]').first().innerText()).toMatch(/managed, v6/);
    page.removeAllListeners('dialog');
    page.on('dialog', (d) => void d.accept());
    // Retire generation 1, schedule its destruction after the shortest wait, cancel, bring it back.
    const first = page.locator('table.generations tr[data-generation="1"]');
    await page.getByRole('button', { name: 'Retire generation 1' }).click();
    await says(page, /Generations up to 1 retired\./);
    await expect.poll(() => first.innerText()).toMatch(/retired/);
    await says(page, /Generations below 2 are retired/);
    await page.getByLabel(/Waiting period before a destruction/).fill('3');
    await page.getByRole('button', { name: 'Destroy generation 1' }).click();
    await says(page, /at least 7|greater than or equal to 7|>=\s?7/i);
    await page.getByLabel(/Waiting period before a destruction/).fill('7');
    await page.getByRole('button', { name: 'Destroy generation 1' }).click();
    await says(page, /Generation 1 will be destroyed after .*; until then it can be cancelled\./);
    await expect.poll(() => first.innerText()).toMatch(/pending_destruction/);
    await accessible(page);
    await page.getByRole('button', { name: 'Cancel destruction of generation 1' }).click();
    await says(page, /Destruction cancelled\./);
    await page.getByRole('button', { name: 'Bring back generation 1' }).click();
    await says(page, /Generation 1 decrypts again\./);
    await expect.poll(() => first.innerText()).toMatch(/rotated/);
    await page.getByLabel('Valid for (hours, optional)').fill('24');
    await page.getByRole('button', { name: 'Create a share link' }).click();
    await says(page, /Share link created\./);
    await expect.poll(() => page.locator('ul.shares').innerText()).toMatch(/active, 0 view/);
    await accessible(page);

    // The activity page follows events live in a second tab.
    const { page: watcher } = await open('activity', { signedOut: false });
    await watcher.goto(origin + '/activity');
    await expect.poll(() => watcher.getByRole('status').first().innerText(), { timeout: 10_000 }).toMatch(/Following events/);

    await page.getByRole('link', { name: 'Files' }).click();
    await says(page, /What to do/);
    await accessible(page);
    const inputs = [
      { name: 'one.txt', mimeType: 'text/plain', buffer: Buffer.from('the first file\n'.repeat(1000)) },
      { name: 'two.bin', mimeType: 'application/octet-stream', buffer: Buffer.from(Array.from({ length: 70_000 }, (_, i) => i % 251)) },
    ];
    await page.getByLabel(/Files \(choose/).setInputFiles(inputs);
    await page.getByRole('button', { name: 'Encrypt' }).click();
    await says(page, /2 files encrypted\./);
    const encrypted: { name: string; path: string }[] = [];
    for (const link of await page.locator('ul.outputs a').all()) {
      const d = page.waitForEvent('download');
      await link.click();
      const file = await d;
      encrypted.push({ name: file.suggestedFilename(), path: await file.path() });
    }
    expect(encrypted.map((e) => e.name).sort()).toEqual(['one.txt.gpg', 'two.bin.gpg']);
    await expect.poll(() => watcher.locator('ul.live li[data-type="jobs.completed"]').count(), { timeout: 15_000 }).toBeGreaterThan(0);

    // Decrypt what was downloaded, and get the originals back.
    await page.getByLabel('Decrypt').check();
    await page.getByLabel('Passphrase of the key').fill('key passphrase 123');
    await page.getByLabel(/Files \(choose/).setInputFiles(encrypted.map((e) => e.path));
    await page.getByRole('button', { name: 'Decrypt' }).click();
    await says(page, /2 files decrypted\./);
    const row = page.locator('tbody tr').first();
    for (const link of await row.locator('ul.outputs a').all()) {
      const d = page.waitForEvent('download');
      await link.click();
      const file = await d;
      const original = inputs.find((i) => file.suggestedFilename().startsWith(i.name.split('.')[0]))!;
      expect(Buffer.compare(await readFile(await file.path()), original.buffer), file.suggestedFilename()).toBe(0);
    }
    await expect.poll(() => watcher.locator('ul.live li[data-type="jobs.completed"]').count(), { timeout: 15_000 }).toBeGreaterThan(1);
    // Each live event is a line in words with its time, not JSON.
    const line = watcher.locator('ul.live li[data-type="jobs.completed"]').first();
    expect(await line.locator('time').getAttribute('datetime')).toMatch(/^\d{4}-\d\d-\d\dT/);
    expect(await line.innerText()).toMatch(/jobs\.completed — .*completed/);
    expect(await line.innerText()).not.toContain('{');
    await accessible(watcher);
    // After a reload the recent jobs come from the event history.
    await page.reload();
    await expect.poll(() => page.locator('tr[data-job]').count()).toBe(2);

    // The audit log shows what was done, filtered.
    await page.getByRole('link', { name: 'Activity' }).click();
    await expect.poll(() => page.locator('table.audit').innerText()).toMatch(/keys\.encrypt/);
    // The chooser offers every action and each family's prefix; the placeholder is a real action.
    expect(await page.locator('#audit-actions option[value="keys.generate"]').count()).toBe(1);
    expect(await page.locator('#audit-actions option[value="keys.*"]').count()).toBe(1);
    expect(await page.getByLabel('Action').getAttribute('placeholder')).toBe('keys.rotate');
    await page.getByLabel('Action').fill('keys.generate');
    await page.getByRole('button', { name: 'Filter' }).click();
    await expect.poll(() => page.locator('table.audit caption').innerText()).toMatch(/^1 entries/);
    // The target in words, its id on hover.
    const target = page.locator('table.audit tbody tr td').nth(3);
    expect(await target.getAttribute('title')).toMatch(/^[0-9A-F]{40}$/i);
    expect(await target.innerText()).toMatch(/\([0-9A-F]{16}\)$/i);
    await page.getByLabel('Action').fill('keys.');
    await page.getByRole('button', { name: 'Filter' }).click();
    await expect.poll(() => page.locator('table.audit caption').innerText()).not.toMatch(/^1 entries/);
    await accessible(page);
    expect(problems).toEqual([]);
    await watcher.close();
    await page.close();
  });

  it('imports gpg keys (secret from a file, public pasted), signs and verifies files, signs while encrypting and verifies while decrypting', async () => {
    const { page, problems } = await open('signatures');
    const home = await createPgpHome();
    try {
      const GPG_PASS = 'what gpg locked it with';
      const gpgKey = async (uid: string) => {
        await home.gpg(['--quick-generate-key', uid, 'future-default', 'default', 'never'], { passphrase: GPG_PASS });
        // The service writes fingerprints in lower case.
        return /^fpr:+([0-9A-F]{40}):/m.exec((await home.gpg(['--with-colons', '--list-keys', uid])).stdout.toString())![1].toLowerCase();
      };
      const partner = await gpgKey('Partner Signer <signer@example.test>');
      const recipient = await gpgKey('Partner Recipient <recipient@example.test>');
      await s.api('POST', '/partners/register', { body: { username: 'signer', email: 'signer@example.test', password: 'signer password 123' } });
      await signIn(page, 'signer', 'signer password 123');

      // A binary secret key through the file chooser: a managed key; its 201 answer is shown.
      const secret = (await home.gpg(['--export-secret-keys', partner], { passphrase: GPG_PASS })).stdout;
      await page.getByLabel('Key file (armored or binary)').setInputFiles({ name: 'partner.gpg', mimeType: 'application/octet-stream', buffer: secret });
      await page.getByLabel('Label of the imported key').fill('partner signer');
      await page.getByLabel('Passphrase the key has now').fill('a wrong passphrase');
      await page.getByLabel('New passphrase here').fill('imported passphrase 1');
      await page.getByRole('button', { name: 'Import', exact: true }).click();
      await expect.poll(() => page.getByRole('alert').innerText()).toMatch(/\.$/);
      await page.getByLabel('Passphrase the key has now').fill(GPG_PASS);
      await page.getByRole('button', { name: 'Import', exact: true }).click();
      await says(page, /Key "partner signer" imported as a managed key\./);
      await expect.poll(() => page.locator('dl.imported').innerText()).toContain(partner);
      // An armored public key pasted: a recipient key, listed as such, that cannot be rotated.
      const pub = (await home.gpg(['--export', '--armor', recipient])).stdout.toString();
      await page.getByLabel('Or paste an armored key').fill(pub);
      await page.getByLabel('Label of the imported key').fill('partner recipient');
      await page.getByRole('button', { name: 'Import', exact: true }).click();
      await says(page, /Key "partner recipient" imported as a recipient key\./);
      const recipientRow = page.locator(`tr[data-fingerprint="${recipient}"]`);
      await expect.poll(() => recipientRow.innerText()).toMatch(/recipient \(public key only\)/);
      expect(await recipientRow.getByRole('button', { name: /Rotate/ }).count()).toBe(0);
      expect(
        await page
          .locator(`tr[data-fingerprint="${partner}"]`)
          .getByRole('button', { name: /Rotate/ })
          .count(),
      ).toBe(1);
      await accessible(page);

      // Sign a file in the page (armored detached signature), then verify it; a wrong pairing is not valid.
      await page.getByRole('link', { name: 'Files' }).click();
      await says(page, /What to do/);
      const text = { name: 'contract.txt', mimeType: 'text/plain', buffer: Buffer.from('the terms\n'.repeat(500)) };
      const other = { name: 'other.txt', mimeType: 'text/plain', buffer: Buffer.from('something else\n') };
      await page.getByLabel('Sign', { exact: true }).check();
      expect(await page.getByLabel(/^Key/).locator('option').allInnerTexts()).toEqual([expect.stringMatching(/^partner signer/)]);
      await page.getByLabel('Passphrase of the key').fill('imported passphrase 1');
      await page.getByLabel(/ASCII armor/).check();
      await page.getByLabel(/Files \(choose/).setInputFiles([text]);
      await page.getByRole('button', { name: 'Sign', exact: true }).click();
      await says(page, /1 file signed\./);
      const sigLink = page.locator('tr[data-job]').first().locator('ul.outputs a');
      const d = page.waitForEvent('download');
      await sigLink.click();
      const sig = await d;
      expect(sig.suggestedFilename()).toBe('contract.txt.asc');
      const sigPath = await home.put('contract.txt.asc', await readFile(await sig.path()));
      expect(await readFile(sigPath, 'utf8')).toMatch(/^-----BEGIN PGP SIGNATURE-----/);
      // gpg agrees: the imported key's current generation made it.
      await home.gpg(['--verify', sigPath, await home.put('contract.txt', text.buffer)]);
      await accessible(page);

      await page.getByLabel('Verify signatures').check();
      await page.getByLabel(/^Key/).selectOption(partner);
      await page.getByLabel(/Files \(choose/).setInputFiles([text, other]);
      await page.getByLabel(/Detached signatures \(one per file/).setInputFiles([sigPath, sigPath]);
      await expect.poll(() => page.locator('ol.pairs').innerText()).toMatch(/contract\.txt ← contract\.txt\.asc[\s\S]*other\.txt ← contract\.txt\.asc/);
      await page.getByRole('button', { name: 'Verify signatures' }).click();
      await says(page, /2 files checked\. Signatures: 1 of 2 valid\./);
      const verdicts = page.locator('tr[data-job]').first().locator('ul.signatures li');
      await expect
        .poll(() => verdicts.allInnerTexts())
        .toEqual([
          expect.stringMatching(new RegExp(`^contract\\.txt: valid, signed by ${partner} at `)),
          expect.stringMatching(/^other\.txt: not valid \(bad_signature\)/),
        ]);
      // A signature gpg made verifies against a public key file given in the page.
      await page.getByLabel('Verify signatures').check();
      const gpgSig = home.file('other.txt.sig');
      await home.gpg(['--local-user', recipient, '--detach-sign', '-o', gpgSig, await home.put('other.txt', other.buffer)], { passphrase: GPG_PASS });
      await page.getByLabel(/signer's public key file/).setInputFiles({ name: 'recipient.asc', mimeType: 'application/pgp-keys', buffer: Buffer.from(pub) });
      await page.getByLabel(/Files \(choose/).setInputFiles([other]);
      await page.getByLabel(/Detached signatures \(one per file/).setInputFiles([gpgSig]);
      await page.getByRole('button', { name: 'Verify signatures' }).click();
      await says(page, /1 file checked\. Signatures: 1 of 1 valid\./);
      await accessible(page);

      // Sign while encrypting to the recipient key; decrypting needs its secret, so encrypt to our own key
      // too: sign with it and encrypt to it, then decrypt requiring the signature.
      await page.getByLabel('Encrypt', { exact: true }).check();
      await page.getByLabel(/^Key/).selectOption(partner);
      await page.getByLabel('Sign with (optional)').selectOption(partner);
      await page.getByLabel('Passphrase of the signing key').fill('imported passphrase 1');
      await page.getByLabel(/Files \(choose/).setInputFiles([text]);
      await page.getByRole('button', { name: 'Encrypt', exact: true }).click();
      await says(page, /1 file encrypted\./);
      const e = page.waitForEvent('download');
      await page.locator('tr[data-job]').first().locator('ul.outputs a').click();
      const encrypted = await (await e).path();
      await page.getByLabel('Decrypt', { exact: true }).check();
      await page.getByLabel(/^Key/).selectOption(partner);
      await page.getByLabel('Passphrase of the key').fill('imported passphrase 1');
      await page.getByLabel('Verify with (optional)').selectOption(partner);
      await page.getByLabel(/Require a valid signature/).check();
      await page.getByLabel(/Files \(choose/).setInputFiles(encrypted);
      await page.getByRole('button', { name: 'Decrypt', exact: true }).click();
      await says(page, /1 file decrypted\. Signatures: 1 of 1 valid\./);
      await expect.poll(() => page.locator('tr[data-job]').first().locator('ul.signatures').innerText()).toMatch(/valid, signed by/);
      // The same file required to be signed by the recipient key fails, and publishes nothing.
      await page.getByLabel('Verify with (optional)').selectOption(recipient);
      await page.getByLabel('Passphrase of the key').fill('imported passphrase 1');
      await page.getByLabel(/Files \(choose/).setInputFiles(encrypted);
      await page.getByRole('button', { name: 'Decrypt', exact: true }).click();
      await expect.poll(() => page.locator('p.job').getAttribute('data-state'), { timeout: 15_000 }).toBe('failed');
      await says(page, /failed: The message's signature is not valid \(unknown_signer\)\./);
      expect(await page.locator('tr[data-job]').first().locator('ul.outputs a').count()).toBe(0);
      await accessible(page);
      expect(problems).toEqual([]);
    } finally {
      await home.cleanup();
      await page.close();
    }
  });

  it('forgot password → the emailed link → a new password → sign in; an email change → its confirmation link', async () => {
    const { page, problems } = await open('recovery');
    await s.api('POST', '/partners/register', { body: { username: 'forgetful', email: 'forgetful@example.test', password: 'the old password 1' } });
    await page.goto(`${origin}/forgot-password`);
    await accessible(page);
    await page.getByLabel('Email').fill('forgetful@example.test');
    await page.getByRole('button', { name: 'Send the reset email' }).click();
    await says(page, /reset email is on its way/);
    const mail = await smtp.waitFor('forgetful@example.test');
    const link = /Or open: (\S+)/.exec(mail.text ?? '')![1];
    expect(link.startsWith(`${origin}/reset-password#token=`)).toBe(true);
    await page.goto(link);
    await says(page, /Set a new password/);
    await expect.poll(() => page.url()).toBe(`${origin}/reset-password`); // the token left the address bar
    await accessible(page);
    await page.getByLabel('New password').fill('short');
    await page.getByRole('button', { name: 'Set the password' }).click();
    await says(page, /Set a new password/);
    await page.getByLabel('New password').fill('the new password 2');
    await page.getByRole('button', { name: 'Set the password' }).click();
    await says(page, /Your password was changed/);
    await page.getByRole('link', { name: /Sign in with the new password/ }).click();
    await page.getByLabel('Username or email').fill('forgetful');
    await page.getByLabel('Password').fill('the new password 2');
    await page.getByRole('button', { name: 'Sign in', exact: true }).click();
    await expect.poll(() => page.url()).toBe(`${origin}/keys`);

    await page.getByRole('link', { name: 'Profile' }).click();
    await accessible(page);
    await page.getByLabel('Email', { exact: true }).fill('remembered@example.test');
    await page.getByLabel(/Current password \(needed/).fill('the new password 2');
    await page.getByRole('button', { name: 'Save' }).first().click();
    await says(page, /confirmation link to remembered@example.test/);
    const confirm = await smtp.waitFor('remembered@example.test');
    const confirmLink = /Or open: (\S+)/.exec(confirm.text ?? '')![1];
    expect(confirmLink.startsWith(`${origin}/confirm-email#token=`)).toBe(true);
    await page.goto(confirmLink);
    await says(page, /Confirmed: your email address is remembered@example.test\./);
    await accessible(page);
    expect(problems).toEqual([]);
    await page.close();
  });

  it('review after recovery: the reset email points at it, and the page resumes the webhook the reset paused', async () => {
    const { page, problems } = await open('recovery-review');
    const email = 'recovered@example.test';
    const reg = await s.api('POST', '/partners/register', { body: { username: 'recovered', email, password: 'the old password 3' } });
    const hook = await s.api('POST', '/webhooks', { token: reg.body.session.token, body: { url: 'http://127.0.0.1:9/sink', description: 'planted' } });
    expect(hook.status).toBe(201);
    expect((await s.api('POST', '/auth/forgot-password', { body: { email } })).status).toBe(202);
    const token = /Reset token: (\S+)/.exec((await smtp.waitFor(email)).text ?? '')![1];
    expect((await s.api('POST', '/auth/reset-password', { body: { token, new_password: 'the new password 3' } })).status).toBe(200);
    await expect.poll(() => smtp.received.some((m) => JSON.stringify(m.to).includes(email) && /password was reset/.test(m.subject ?? ''))).toBe(true);
    const done = smtp.received.find((m) => JSON.stringify(m.to).includes(email) && /password was reset/.test(m.subject ?? ''))!;
    expect(done.text).toContain('webhook 127.0.0.1:9 (planted): paused');
    expect(done.text).toContain(`${origin}/recovery-review`);

    await signIn(page, 'recovered', 'the new password 3');
    await page.goto(`${origin}/recovery-review`);
    await says(page, /Webhook: 127\.0\.0\.1:9 \(planted\)/);
    await accessible(page);
    await page.getByRole('button', { name: 'Resume: 127.0.0.1:9 (planted)' }).click();
    await says(page, /Nothing awaits your review\./);
    await says(page, /127\.0\.0\.1:9 \(planted\): kept/);
    const session = await s.api('POST', '/auth/login', { body: { identifier: 'recovered', password: 'the new password 3' } });
    expect((await s.api('GET', `/webhooks/${hook.body.webhook_id}`, { token: session.body.session.token })).body).toMatchObject({ enabled: true });
    expect(problems).toEqual([]);
    await page.close();
  });

  it("a sign-in refused for too many failures (429) shows the API's detail and its wait", async () => {
    const { page } = await open('locked');
    await s.api('POST', '/partners/register', { body: { username: 'hammered', email: 'hammered@example.test', password: 'hammered password 1' } });
    await page.goto(`${origin}/sign-in`);
    await page.getByLabel('Username or email').fill('hammered');
    let alert = '';
    for (let i = 0; i < 8 && !/Try again in/.test(alert); i++) {
      await page.getByLabel('Password').fill(`wrong password ${i}`);
      const answered = page.waitForResponse((r) => r.url().endsWith('/api/v1/auth/login'));
      await page.getByRole('button', { name: 'Sign in', exact: true }).click();
      await answered;
      await expect.poll(() => page.getByRole('alert').count()).toBe(1);
      alert = await page.getByRole('alert').innerText();
    }
    expect(alert).toMatch(/\. Try again in \d+ seconds?\.$/);
    await page.close();
  });

  it('passkeys: a stale sign-in leads to re-sign-in and back, a passkey is added (virtual authenticator), then signs in', async () => {
    const { page, problems } = await open('passkeys');
    const cdp = await context.newCDPSession(page);
    await cdp.send('WebAuthn.enable');
    const { authenticatorId } = await cdp.send('WebAuthn.addVirtualAuthenticator', {
      options: {
        protocol: 'ctap2',
        transport: 'internal',
        hasResidentKey: true,
        hasUserVerification: true,
        isUserVerified: true,
        automaticPresenceSimulation: true,
      },
    });
    await s.api('POST', '/partners/register', { body: { username: 'keyholder', email: 'keyholder@example.test', password: 'keyholder password 1' } });
    await signIn(page, 'keyholder', 'keyholder password 1');
    await page.getByRole('link', { name: 'Credentials' }).click();
    await says(page, /Passkeys/);
    await accessible(page);
    await withClockAhead(s.c.clock as ManualClockFollowingTime, 11 * 60_000, async () => {
      await page.getByLabel('Passkey name').fill('Chromium virtual');
      await page.getByRole('button', { name: 'Add a passkey' }).click();
      // 403 reauthentication_required: sign in again, and the console returns to the page.
      await expect.poll(() => page.url()).toBe(`${origin}/sign-in`);
      await says(page, /sign in again/);
      await page.getByLabel('Username or email').fill('keyholder');
      await page.getByLabel('Password').fill('keyholder password 1');
      await page.getByRole('button', { name: 'Sign in', exact: true }).click();
      await expect.poll(() => page.url()).toBe(`${origin}/credentials`);
      await page.getByLabel('Passkey name').fill('Chromium virtual');
      await page.getByRole('button', { name: 'Add a passkey' }).click();
      await says(page, /Passkey "Chromium virtual" added\./);
    });
    expect((await cdp.send('WebAuthn.getCredentials', { authenticatorId })).credentials).toHaveLength(1);
    await page.getByRole('button', { name: 'Sign out' }).click();
    await expect.poll(() => page.url()).toBe(`${origin}/sign-in`);
    await page.getByRole('button', { name: 'Sign in with a passkey' }).click();
    await expect.poll(() => page.url()).toBe(`${origin}/keys`);
    await expect.poll(() => page.locator('header .who').innerText()).toMatch(/keyholder/);

    // A managed API key with one scope, its value shown once, a share link, revoked.
    await page.getByRole('link', { name: 'Credentials' }).click();
    await page.getByLabel('Name', { exact: true }).fill('ci reader');
    await page.getByLabel('keys:read').check();
    await page.getByRole('button', { name: 'Generate an API key' }).click();
    await expect.poll(() => page.locator('.warning .secret').innerText()).toMatch(/^kms_sk_/);
    await page.getByRole('button', { name: 'Share link of ci reader' }).click();
    await expect.poll(() => page.locator('ul.api-key-shares').innerText()).toMatch(/ci reader: active, 0 view/);
    // Revoking asks first: accepted.
    page.once('dialog', (d) => void d.accept());
    await page.locator('ul.api-key-shares').getByRole('button', { name: 'Revoke' }).click();
    await says(page, /Share link revoked\./);
    await expect.poll(() => page.locator('ul.api-key-shares').innerText()).toMatch(/ci reader: revoked/);
    // A webhook that receives two event types, ticked from the list of every type.
    expect(await page.locator('fieldset.event-types input[type="checkbox"]').count()).toBeGreaterThan(30);
    await page.getByLabel('Endpoint URL').fill('http://127.0.0.1:9/console-hook');
    await page.getByLabel('keys.rotated', { exact: true }).check();
    await page.getByLabel('jobs.failed', { exact: true }).check();
    await page.getByRole('button', { name: 'Add an endpoint' }).click();
    await expect.poll(() => page.locator('section[aria-labelledby="webhooks-h"] ul').innerText()).toMatch(/console-hook.*keys\.rotated, jobs\.failed/);
    await accessible(page);
    // The 403 on the way was the API's answer, shown as a page change rather than an error.
    expect(problems.filter((p) => !/403/.test(p))).toEqual([]);
    await page.close();
  });

  it('invitation → the emailed accept link → sign in → accept → team link → the teammate approves', async () => {
    const { page, problems } = await open('team');
    await s.api('POST', '/partners/register', { body: { username: 'lead', email: 'lead@example.test', password: 'lead password 123' } });
    await s.api('POST', '/partners/register', { body: { username: 'newcomer', email: 'newcomer@example.test', password: 'newcomer password 1' } });
    await signIn(page, 'lead', 'lead password 123');
    await page.getByRole('link', { name: 'Team and billing' }).click();
    await says(page, /You are its owner/);
    await accessible(page);
    await page.getByLabel('Invite by email').fill('newcomer@example.test');
    await page.getByRole('button', { name: 'Send the invitation' }).click();
    await says(page, /Invitation sent to newcomer@example.test\./);
    await page.getByRole('button', { name: 'Sign out' }).click();

    const mail = await smtp.waitFor('newcomer@example.test');
    const link = /Or open: (\S+)/.exec(mail.text ?? '')![1];
    expect(link.startsWith(`${origin}/accept-invitation#token=`)).toBe(true);
    await page.goto(link);
    await page.getByRole('button', { name: 'Sign in to accept' }).click();
    await page.getByLabel('Username or email').fill('newcomer');
    await page.getByLabel('Password').fill('newcomer password 1');
    await page.getByRole('button', { name: 'Sign in', exact: true }).click();
    await expect.poll(() => page.url()).toMatch(`${origin}/accept-invitation`);
    await accessible(page);
    await page.getByRole('button', { name: 'Accept the invitation' }).click();
    await says(page, /You joined ".*" as member\./);
    await page.getByRole('link', { name: 'Go to your team' }).click();
    await says(page, /Team access/);
    await page.getByLabel('Teammate').selectOption({ label: 'lead (lead@example.test)' });
    await page.getByRole('button', { name: 'Link to this teammate' }).click();
    await says(page, /Link requested\./);
    await expect.poll(() => page.locator('.team-status').innerText()).toMatch(/Linked to lead: approval pending/);
    await page.getByRole('button', { name: 'Sign out' }).click();

    await signIn(page, 'lead', 'lead password 123');
    await page.getByRole('link', { name: 'Team and billing' }).click();
    await page.getByRole('button', { name: 'Approve newcomer' }).click();
    await says(page, /Approved newcomer\./);
    await accessible(page);
    const newcomer = await s.api('POST', '/auth/login', { body: { identifier: 'newcomer', password: 'newcomer password 1' } });
    const status = await s.api('GET', '/team-access/status', { token: newcomer.body.session.token });
    expect(status.body).toMatchObject({ linked: true, approval: 'approved' });
    expect(problems).toEqual([]);
    await page.close();
  });

  it('an administrator opens Bull Board from the console, and directly by its address; it asks nothing of another host', async () => {
    const { page } = await open('admin');
    const foreign: string[] = [];
    page.on('request', (r) => {
      if (/^https?:/.test(r.url()) && new URL(r.url()).origin !== origin) foreign.push(r.url());
    });
    const reg = await s.api('POST', '/partners/register', { body: { username: 'operator', email: 'operator@example.test', password: 'operator password 1' } });
    await s.c.db('users').where({ id: reg.body.user.user_id }).update({ role: 'admin' });
    await signIn(page, 'operator', 'operator password 1');
    await page.getByRole('link', { name: 'Administration' }).click();
    await says(page, /Postgres up, Redis up/);
    await says(page, /Key health/);
    await accessible(page);
    await page.getByRole('link', { name: 'Open Bull Board' }).click();
    await expect.poll(() => page.url()).toBe(`${origin}/admin/queues`);
    await expect.poll(() => page.title(), { timeout: 15_000 }).toMatch(/KMS queues/);
    await expect.poll(() => page.locator('#root').innerText(), { timeout: 15_000 }).toMatch(/crypto/);
    // Opened directly (a bookmark, a new tab) with the console's session only: the page and its API answer.
    await page.goto(`${origin}/admin/queues/queue/notify`);
    await expect.poll(() => page.locator('#root').innerText(), { timeout: 15_000 }).toMatch(/notify/);
    expect(foreign).toEqual([]);
    await page.close();
  });
});
