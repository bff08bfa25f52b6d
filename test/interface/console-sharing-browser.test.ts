import { afterAll, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { BrowserContext, Page } from 'playwright-core';
import type { TestService } from '../support/service';
import { openChromium, screenshot, startOnLocalhost } from '../support/browser';
import { startSmtpServer } from '../support/smtp';
import { createKey } from '../support/keys';
import { buildConsole } from '../../scripts/build-console.mjs';

/**
 * Share links and invitations as a person meets them, in Debian's Chromium against the real service: an
 * invitation opened signed out names its organization and inviter and leads through registration back to
 * itself; a key's share links are links with a Copy button; the analytics chart is named by its totals; a
 * share link opened in the browser is a page (no CSP violation). Each page is checked with axe-core.
 */
const AXE = await readFile(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

let s: TestService;
let smtp: Awaited<ReturnType<typeof startSmtpServer>>;
let origin: string;
let work: string;
let context: BrowserContext;

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), 'kms-console-sharing-'));
  await buildConsole(join(work, 'console'));
  smtp = await startSmtpServer();
  ({ s, origin } = await startOnLocalhost((origin) => ({ WEBAUTHN_ORIGINS: origin, CONSOLE_DIR: join(work, 'console'), SMTP_URL: smtp.url })));
  context = await openChromium(join(work, 'profile'), { viewport: { width: 390, height: 900 } });
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin });
});
afterAll(async () => {
  await context?.close();
  await s?.stop();
  await smtp?.close();
  if (work) await rm(work, { recursive: true, force: true });
});

async function open(name: string) {
  await context.clearCookies();
  const page = await context.newPage();
  const problems: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(e.message));
  onTestFailed(async () => {
    await screenshot(page, `console-sharing-${name}`).catch(() => undefined);
  });
  return { page, problems };
}

async function accessible(page: Page): Promise<void> {
  await page.evaluate(AXE);
  const violations = await page.evaluate<string[]>(`axe.run().then((r) => r.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => v.id + ': ' + v.nodes.map((n) => n.target.join(' ')).join(', ')))`);
  expect(violations, `axe on ${page.url()}`).toEqual([]);
}

const says = (page: Page, text: string | RegExp) => expect.poll(() => page.locator('main').innerText(), { timeout: 15_000 }).toMatch(text);
const noSideways = async (page: Page) => expect(await page.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);

describe('share links and invitations in Chromium', { timeout: 90_000 }, () => {
  it('an invitation opened signed out names who invited into what, registers, comes back and is accepted', async () => {
    const { page, problems } = await open('invitation');
    const lead = await s.api('POST', '/partners/register', { body: { username: 'inviter', email: 'inviter@example.test', password: 'inviter password 1' } });
    const org = (await s.api('GET', '/organization', { token: lead.body.session.token })).body;
    expect((await s.api('POST', '/organization/invitations', { token: lead.body.session.token, body: { email: 'joiner@example.test' } })).status).toBe(201);
    const mail = await smtp.waitFor('joiner@example.test');
    const link = /Or open: (\S+)/.exec(mail.text ?? '')![1];

    await page.goto(link);
    await says(page, `inviter invited joiner@example.test to join the organization ${org.name} as member`);
    await accessible(page);
    await noSideways(page);
    await page.getByRole('button', { name: 'Register to accept' }).click();
    await expect.poll(() => page.url()).toBe(`${origin}/register`);
    expect(await page.getByLabel('Email').inputValue()).toBe('joiner@example.test');
    await page.getByLabel('Username').fill('joiner');
    await page.getByLabel('Password').fill('joiner password 12');
    await page.getByRole('button', { name: 'Register' }).click();
    await page.getByRole('button', { name: 'I stored it: go back to the invitation' }).click();
    await expect.poll(() => page.url()).toMatch(`${origin}/accept-invitation#token=`);
    await page.getByRole('button', { name: 'Accept the invitation' }).click();
    await says(page, `You joined "${org.name}" as member.`);

    // A fresh load (a change of the fragment alone is no new page).
    await page.goto('about:blank');
    await page.goto(`${origin}/accept-invitation#token=kms_inv_nope`);
    await says(page, /This invitation is not valid/);
    expect(problems).toEqual([]);
    await page.close();
  });

  it("a key's share links are links with Copy; the analytics chart names its totals; the link opens as a page", async () => {
    const { page, problems } = await open('shares');
    const reg = await s.api('POST', '/partners/register', { body: { username: 'sharer', email: 'sharer@example.test', password: 'sharer password 12' } });
    const key = await createKey(s.api, reg.body.session.token, { label: 'shared key' });
    const made = (await s.api('POST', '/keys/share/create', { token: reg.body.session.token, body: { fingerprint: key.fingerprint } })).body;
    expect((await s.api('GET', `/keys/share/${made.share_token}`)).status).toBe(200);

    await page.goto(`${origin}/sign-in`);
    await page.getByLabel('Username or email').fill('sharer');
    await page.getByLabel('Password').fill('sharer password 12');
    await page.getByRole('button', { name: 'Sign in', exact: true }).click();
    await expect.poll(() => page.url()).toBe(`${origin}/keys`);
    const chart = page.getByRole('img', { name: /Share link views per day, last 30 days: 1 in all/ });
    await expect.poll(() => chart.count()).toBe(1);
    await page.getByRole('button', { name: 'Details of shared key' }).click();
    const anchor = page.locator(`.shares a[href="${made.url}"]`);
    await expect.poll(() => anchor.count()).toBe(1);
    await page
      .locator('.shares')
      .getByRole('button', { name: /^Copy the share link/ })
      .click();
    await expect.poll(() => page.locator('.shares .share-link button').innerText()).toMatch(/^Copied/);
    expect(await page.evaluate<string>('navigator.clipboard.readText()')).toBe(made.url);
    await accessible(page);
    await noSideways(page);

    // The console's origin is the link's (publicUrl): opened in the browser it is the key's page.
    await page.goto(made.url.replace(s.config.publicUrl, origin));
    await expect.poll(() => page.locator('h1').innerText()).toBe('Public key: shared key');
    await accessible(page);
    await noSideways(page);
    expect(problems).toEqual([]);
    await page.close();
  });
});
