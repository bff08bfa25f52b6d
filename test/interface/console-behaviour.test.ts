import { afterAll, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { BrowserContext, Dialog, Page } from 'playwright-core';
import type { TestService } from '../support/service';
import { openChromium, screenshot, startOnLocalhost } from '../support/browser';
import { startSmtpServer } from '../support/smtp';
import { teamHelpers, type User } from '../support/teams';
import { createKey, PASSPHRASE, runJob } from '../support/keys';
import { buildConsole } from '../../scripts/build-console.mjs';

/**
 * What the console does, beyond how it looks (console-layout.test.ts): nothing silently wrong (a typed
 * rotation interval that is no number is refused, never read as "off"; a teammate's keys are theirs, with
 * only the actions the grant allows; a revoked API key offers nothing it cannot do), the server's field
 * errors under their fields, confirmations that say what an action ends, a failed job's reason, a team of
 * one. One browser, one page per test, the session set as a cookie.
 */
let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;
let origin: string;
let work: string;
let context: BrowserContext;
const { newUser, team, link } = teamHelpers(() => ({ s, smtp }));

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), 'kms-behaviour-'));
  await buildConsole(join(work, 'console'));
  smtp = await startSmtpServer();
  ({ s, origin } = await startOnLocalhost((origin) => ({ WEBAUTHN_ORIGINS: origin, CONSOLE_DIR: join(work, 'console'), SMTP_URL: smtp.url })));
  context = await openChromium(join(work, 'profile'), { viewport: { width: 1280, height: 900 } });
}, 60_000);
afterAll(async () => {
  await context?.close();
  await s?.stop();
  await smtp?.close();
  if (work) await rm(work, { recursive: true, force: true });
});

/** A page signed in as `u` (the cookie POST /auth/session sets), or signed out; script errors fail the test. */
async function pageAs(u: User | undefined, name: string): Promise<{ page: Page; errors: string[] }> {
  await context.clearCookies();
  if (u) {
    const res = await fetch(`${origin}/api/v1/auth/session`, { method: 'POST', headers: { authorization: `Bearer ${u.token}` } });
    expect(res.status).toBe(200);
    const value = /^kms_session=([^;]+)/.exec(res.headers.get('set-cookie')!)![1];
    await context.addCookies([{ name: 'kms_session', value, domain: 'localhost', path: '/', httpOnly: true, sameSite: 'Strict' }]);
  }
  const page = await context.newPage();
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  onTestFailed(async () => {
    await screenshot(page, `behaviour-${name}`).catch(() => undefined);
  });
  return { page, errors };
}

const says = (page: Page, text: string | RegExp) => expect.poll(() => page.locator('main').innerText(), { timeout: 15_000 }).toMatch(text);

/** The message a field's input points at (aria-describedby), once the input is marked invalid. */
async function fieldError(page: Page, label: string | RegExp): Promise<string> {
  const input = page.getByLabel(label, { exact: typeof label === 'string' });
  await expect.poll(() => input.getAttribute('aria-invalid'), { timeout: 15_000 }).toBe('true');
  const ids = (await input.getAttribute('aria-describedby'))!.split(' ');
  return (await Promise.all(ids.map((id) => page.locator(`[id="${id}"]`).innerText()))).join(' | ');
}

/** Answers the next confirmation with `accept`, handing over its text. */
function nextDialog(page: Page, accept: boolean): Promise<string> {
  return new Promise((resolve) =>
    page.once('dialog', (d: Dialog) => {
      resolve(d.message());
      void (accept ? d.accept() : d.dismiss());
    }),
  );
}

const schedule = async (u: User, fingerprint: string) => {
  const list = await s.api('GET', '/keys/list', { token: u.token });
  const k = list.body.items.find((i: { fingerprint: string }) => i.fingerprint === fingerprint);
  return { mode: k.rotation_mode, days: k.rotation_interval_days };
};

describe('console behaviour', { timeout: 120_000 }, () => {
  it('a rotation interval that is not a whole number of days in range is refused, by the page and by the API, and rotation stays on', async () => {
    const u = await newUser();
    const key = await createKey(s.api, u.token, { label: 'scheduled' });
    const path = `/keys/${key.fingerprint}/rotation-schedule`;
    expect((await s.api('POST', path, { token: u.token, body: { rotation_interval_days: 30 } })).status).toBe(200);
    for (const bad of ['abc', 0, -1, 731, 1.5, '30']) {
      const res = await s.api('POST', path, { token: u.token, body: { rotation_interval_days: bad } });
      expect(res.status, JSON.stringify(bad)).toBe(422);
      expect(res.body.errors.map((e: { path: string }) => e.path)).toEqual(['body.rotation_interval_days']);
    }
    expect(await schedule(u, key.fingerprint)).toEqual({ mode: 'interval', days: 30 });

    const { page, errors } = await pageAs(u, 'rotation-interval');
    await page.goto(`${origin}/keys`);
    await page.getByRole('button', { name: 'Details of scheduled' }).click();
    const days = page.getByLabel(/Rotate every/);
    for (const typed of ['abc', '0', '-5', '731', '2.5']) {
      await days.fill(typed);
      await page.getByRole('button', { name: 'Set the schedule' }).click();
      expect(await fieldError(page, /Rotate every/)).toMatch(/must be a whole number from 1 to 730/);
      expect(await page.locator('main').innerText()).not.toMatch(/Scheduled rotation is off/);
    }
    expect(await schedule(u, key.fingerprint)).toEqual({ mode: 'interval', days: 30 });
    // A number in range is taken; only an empty field turns scheduled rotation off.
    await days.fill(' 45 ');
    await page.getByRole('button', { name: 'Set the schedule' }).click();
    await says(page, /Next rotation .* \(interval\)\./);
    expect(await days.getAttribute('aria-invalid')).toBeNull();
    expect(await schedule(u, key.fingerprint)).toEqual({ mode: 'interval', days: 45 });
    await days.fill('');
    await page.getByRole('button', { name: 'Set the schedule' }).click();
    await says(page, /Scheduled rotation is off\./);
    expect(await schedule(u, key.fingerprint)).toEqual({ mode: 'off', days: null });
    expect(errors).toEqual([]);
    await page.close();
  });

  it("a teammate sees the owner's keys apart, named by owner, with only the public key to take", async () => {
    const [owner, member] = await team(2);
    await createKey(s.api, owner.token, { label: 'owners key' });
    await createKey(s.api, member.token, { label: 'members own key' });
    expect(await link(member, owner)).toMatchObject({ linked: true, state: 'ok' });

    const { page, errors } = await pageAs(member, 'shared-keys');
    await page.goto(`${origin}/keys`);
    const shared = page.locator('table', { has: page.locator('caption', { hasText: 'Keys shared with you by teammates' }) });
    const own = page.locator('table', { has: page.locator('caption', { hasText: /^Your keys$/ }) });
    await expect.poll(() => shared.locator('tbody tr').count(), { timeout: 15_000 }).toBe(1);
    await expect.poll(() => page.getByRole('heading', { name: 'Shared with you' }).count()).toBe(1);
    const row = shared.locator('tbody tr').first();
    expect(await row.innerText()).toContain('owners key');
    expect(await row.innerText()).toContain(owner.username);
    expect(await row.getByRole('button').allInnerTexts()).toEqual(['Public key (.asc)']);
    expect(await own.innerText()).toContain('members own key');
    expect(await own.innerText()).not.toContain('owners key');
    expect(await own.getByRole('button', { name: 'Rotate members own key now' }).count()).toBe(1);
    // What the page leaves out, the API refuses a teammate.
    const fp = await row.getAttribute('data-fingerprint');
    expect((await s.api('POST', `/keys/${fp}/rotate`, { token: member.token, body: {} })).status).toBe(404);
    expect((await s.api('POST', '/keys/disable-key', { token: member.token, body: { fingerprint: fp } })).status).toBe(404);
    expect(errors).toEqual([]);
    await page.close();
  });

  it("the API's field errors show under their fields: an API key's expiry and its scopes", async () => {
    const u = await newUser();
    const { page, errors } = await pageAs(u, 'field-errors');
    await page.goto(`${origin}/credentials`);
    await page.getByLabel('Name', { exact: true }).fill('too long lived');
    await page.getByLabel('Expires in days (optional)').fill('99999');
    await page.getByRole('button', { name: 'Generate an API key' }).click();
    expect(await fieldError(page, 'Expires in days (optional)')).toMatch(/3650/);
    const scopes = page.getByRole('group', { name: 'Scopes' });
    expect(await scopes.getAttribute('aria-invalid')).toBe('true');
    const described = (await scopes.getAttribute('aria-describedby'))!;
    expect(await page.locator(`[id="${described}"]`).innerText()).not.toBe('');
    // The form-level text keeps the problem's detail, and does not repeat what sits under the fields.
    const alert = page.locator('#apikeys-h ~ form [role="alert"]');
    expect(await alert.innerText()).not.toMatch(/expires in days:|scopes:/);
    expect((await s.api('GET', '/api-keys', { token: u.token })).body.items).toEqual([]);
    expect(errors).toEqual([]);
    await page.close();
  });

  it('what ends something asks first and says what it ends; a revoked API key and a missing partner key offer only what is possible', async () => {
    const u = await newUser();
    const made = await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'deployer', scopes: ['keys:read'] } });
    expect(made.status).toBe(201);
    const { page, errors } = await pageAs(u, 'confirmations');
    await page.goto(`${origin}/credentials`);
    const row = page.locator('tr', { hasText: 'deployer' });
    await expect.poll(() => row.count(), { timeout: 15_000 }).toBe(1);

    // Rotate asks; dismissed, the value is unchanged.
    let asked = nextDialog(page, false);
    await row.getByRole('button', { name: 'Rotate deployer' }).click();
    expect(await asked).toMatch(/stops working in one hour/);
    expect((await s.api('GET', `/api-keys/${made.body.key_id}`, { token: u.token })).body.value).toBe(made.body.value);
    // Revoke asks and says it ends every value and its share links; accepted, the row offers none of its actions.
    asked = nextDialog(page, true);
    await row.getByRole('button', { name: 'Revoke deployer' }).click();
    expect(await asked).toMatch(/Every value of it stops working at once, and its share links with it/);
    await expect.poll(() => row.innerText()).toMatch(/revoked/);
    for (const name of ['Show the value of deployer', 'Rotate deployer', 'Share link of deployer', 'Revoke deployer'])
      expect(await row.getByRole('button', { name, exact: true }).count(), name).toBe(0);
    expect(await row.getByRole('button', { name: 'Share links of deployer' }).count()).toBe(1);

    // The partner key: rotating one asks first; none left (a password reset revokes it), the button creates one.
    const partner = page.locator('section', { has: page.locator('#partner-h') });
    asked = nextDialog(page, false);
    await partner.getByRole('button', { name: 'Rotate the partner key' }).click();
    expect(await asked).toMatch(/stops working at once/);
    await s.c.db('partner_api_keys').where({ user_id: u.id }).update({ status: 'revoked', revoked_at: new Date() }); // as a password reset does
    await page.reload();
    await expect.poll(() => partner.getByRole('button', { name: 'Create a partner key' }).count(), { timeout: 15_000 }).toBe(1);
    expect(await partner.getByRole('button', { name: 'Rotate the partner key' }).count()).toBe(0);
    await partner.getByRole('button', { name: 'Create a partner key' }).click(); // no confirmation: nothing ends
    await expect.poll(() => partner.locator('.secret').innerText()).toMatch(/\S/);
    expect(errors).toEqual([]);
    await page.close();
  });

  it('removing a member and unlinking ask first and say what ends', async () => {
    const [owner, member] = await team(2);
    await createKey(s.api, owner.token, { label: 'team key' });
    await link(member, owner);
    const { page, errors } = await pageAs(member, 'team-confirmations');
    await page.goto(`${origin}/team`);
    await expect.poll(() => page.locator('.team-status').innerText(), { timeout: 15_000 }).toMatch(/Linked to/);
    let asked = nextDialog(page, false);
    await page.getByRole('button', { name: 'Remove the link' }).click();
    expect(await asked).toMatch(/Every key you inherit through it is gone at once/);
    expect((await s.api('GET', '/team-access/status', { token: member.token })).body.linked).toBe(true);
    await page.close();

    const { page: ownerPage } = await pageAs(owner, 'team-remove');
    await ownerPage.goto(`${origin}/team`);
    asked = nextDialog(ownerPage, false);
    await ownerPage.getByRole('button', { name: `Remove ${member.username}` }).click();
    expect(await asked).toMatch(/team-access links to and from them end/);
    expect((await s.api('GET', '/organization/members', { token: owner.token })).body.items).toHaveLength(2);
    expect(errors).toEqual([]);
    await ownerPage.close();
  });

  it('on a team of one the teammate picker says there is no one to choose, and its button is disabled', async () => {
    const u = await newUser();
    const { page, errors } = await pageAs(u, 'team-of-one');
    await page.goto(`${origin}/team`);
    await says(page, /There is no one to choose yet/);
    expect(await page.getByLabel('Teammate').isDisabled()).toBe(true);
    expect(await page.getByRole('button', { name: 'Link to this teammate' }).isDisabled()).toBe(true);
    expect(errors).toEqual([]);
    await page.close();
  });

  it("a failed job's bar shows the error state with its reason, and the jobs table names the reason", async () => {
    const u = await newUser();
    const key = await createKey(s.api, u.token, { label: 'decrypting' });
    const earlier = await runJob(s.api, u.token, '/keys/decrypt', {
      fingerprint: key.fingerprint,
      passphrase: PASSPHRASE,
      files: [{ name: 'earlier.txt', data: Buffer.from('not OpenPGP at all') }],
    });
    expect(earlier.state).toBe('failed');
    const { page, errors } = await pageAs(u, 'failed-job');
    await page.goto(`${origin}/files`);
    // An earlier failure, from the event history: the reason next to "failed".
    const earlierRow = page.locator(`tr[data-job="${earlier.job_id}"]`);
    await expect.poll(() => earlierRow.innerText(), { timeout: 15_000 }).toContain(`failed: ${earlier.error.message}`);

    await page.getByLabel('Decrypt', { exact: true }).check();
    await page.getByLabel('Passphrase of the key').fill(PASSPHRASE);
    await page
      .getByLabel(/^Files/)
      .setInputFiles({ name: 'plain.txt', mimeType: 'text/plain', buffer: Buffer.from('plain text, no OpenPGP here '.repeat(40)) });
    await page.getByRole('button', { name: 'Decrypt', exact: true }).click();
    const status = page.locator('main .job[data-state="failed"]');
    await expect.poll(() => status.count(), { timeout: 20_000 }).toBe(1);
    const job = await s.api('GET', `/jobs/${await status.locator('code').innerText()}`, { token: u.token });
    const reason = (e: { message: string; code: string }) => (e.message.includes(e.code) ? e.message : `${e.message} (${e.code})`);
    expect(await status.locator('.error').innerText()).toBe(`: ${reason(job.body.error)}`);
    if (job.body.progress.bytes_total > 0) {
      const bar = status.locator('progress');
      expect(await bar.getAttribute('class')).toBe('failed');
      expect(await bar.getAttribute('aria-label')).toMatch(/stopped: the job failed/);
    }
    const row = page.locator(`tr[data-job="${job.body.job_id}"]`);
    expect(await row.innerText()).toContain(`failed: ${job.body.error.message}`);
    expect(errors).toEqual([]);
    await page.close();
  });

  it('the reset pages warn that a reset revokes the partner key and every managed API key, as the API does', async () => {
    const u = await newUser();
    expect((await s.api('POST', '/api-keys/generate', { token: u.token, body: { name: 'ci', scopes: ['keys:read'] } })).status).toBe(201);
    const { page, errors } = await pageAs(undefined, 'reset-warning');
    for (const path of ['/forgot-password', '/reset-password#token=kms_reset_placeholder']) {
      await page.goto(origin + path);
      await expect
        .poll(() => page.locator('.reset-warning').innerText(), { timeout: 15_000 })
        .toMatch(/revokes your partner API key and every managed API key .*deactivates your passkeys and signs out every session/);
    }
    // What the warning says is what a reset does.
    expect((await s.api('POST', '/auth/forgot-password', { body: { email: u.email } })).status).toBe(202);
    const token = /Reset token: (\S+)/.exec((await smtp.waitFor(u.email)).text ?? '')![1];
    expect((await s.api('POST', '/auth/reset-password', { body: { token, new_password: 'a brand new password 9' } })).status).toBe(200);
    const fresh = await s.api('POST', '/auth/login', { body: { identifier: u.username, password: 'a brand new password 9' } });
    const session = fresh.body.session.token as string;
    expect((await s.api('GET', '/partners/api-key-status', { token: session })).body.status).toBe('none');
    expect((await s.api('GET', '/api-keys', { token: session })).body.items.map((k: { status: string }) => k.status)).toEqual(['revoked']);
    expect(errors).toEqual([]);
    await page.close();
  });
});
