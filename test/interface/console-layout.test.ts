import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { BrowserContext, Page } from 'playwright-core';
import { registerUser, type TestService } from '../support/service';
import { openChromium, screenshot, startOnLocalhost } from '../support/browser';
import { createKey, encrypt } from '../support/keys';
import { buildConsole } from '../../scripts/build-console.mjs';
import { CONSOLE_PATHS, type ConsolePath } from '../../web/console/src/paths';

/**
 * Every page of the console at a phone's width (390 px) and a desktop's (1280 px), signed out, as a user
 * with some of everything (keys, a job, a share link, an API key, a webhook, an invitation, audit rows) and
 * as an administrator (the queue view, with a failed job): no page is wider than the screen, axe-core finds
 * nothing serious or critical, and no request leaves the service's origin. CONSOLE_SCREENSHOTS=<folder>
 * saves a full-page screenshot of every page at both widths there (`<width>-<page>.png`).
 */
const AXE = await readFile(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');
const WIDTHS = [390, 1280] as const;
const SHOTS = process.env.CONSOLE_SCREENSHOTS ? resolve(process.env.CONSOLE_SCREENSHOTS) : undefined;

const SIGNED_OUT: ConsolePath[] = ['/', '/sign-in', '/register', '/forgot-password', '/reset-password', '/confirm-email', '/accept-invitation', '/contact'];
const USER: ConsolePath[] = ['/keys', '/files', '/activity', '/credentials', '/team', '/profile', '/recovery-review'];
const ADMIN: ConsolePath[] = ['/admin'];

let s: TestService;
let origin: string;
let work: string;
let context: BrowserContext;
/** Requests the pages made to any other origin than the service's. */
const foreign: string[] = [];
let user: Awaited<ReturnType<typeof registerUser>>;
let admin: Awaited<ReturnType<typeof registerUser>>;
let failedJob: string;
let sharePages: Record<string, string>;

/** The console's session cookie for a session token, as POST /auth/session sets it. */
async function sessionCookie(token: string): Promise<string> {
  const res = await fetch(`${origin}/api/v1/auth/session`, { method: 'POST', headers: { authorization: `Bearer ${token}` } });
  expect(res.status).toBe(200);
  return /^kms_session=([^;]+)/.exec(res.headers.get('set-cookie')!)![1];
}

async function signInAs(token: string | undefined): Promise<void> {
  await context.clearCookies();
  if (token)
    await context.addCookies([{ name: 'kms_session', value: await sessionCookie(token), domain: 'localhost', path: '/', httpOnly: true, sameSite: 'Strict' }]);
}

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), 'kms-layout-'));
  await buildConsole(join(work, 'console'));
  ({ s, origin } = await startOnLocalhost((origin) => ({ WEBAUTHN_ORIGINS: origin, CONSOLE_DIR: join(work, 'console') })));
  context = await openChromium(join(work, 'profile'), { viewport: { width: 1280, height: 900 } });
  context.on('request', (r) => {
    const url = new URL(r.url());
    if (/^https?:$/.test(url.protocol) && url.origin !== origin) foreign.push(r.url());
  });
  if (SHOTS) await mkdir(SHOTS, { recursive: true });

  // A user with some of everything, long labels and ids included.
  user = await registerUser(s.api, { username: 'layout_user_with_a_long_name' });
  const key = await createKey(s.api, user.token, {
    label: 'Production encryption key for the quarterly partner exchange',
    email: 'a.very.long.address@subdomain.example.test',
  });
  await createKey(s.api, user.token, { label: 'staging', environment: 'staging' });
  await encrypt(s.api, user.token, key.fingerprint, [{ name: 'quarterly-report-with-a-long-file-name-2026.pdf', data: Buffer.from('report body') }]);
  const ok = (res: { status: number; body: unknown }, status = 201) => expect(res.status, JSON.stringify(res.body)).toBe(status);
  const keyShare = await s.api('POST', '/keys/share/create', { token: user.token, body: { fingerprint: key.fingerprint } });
  ok(keyShare);
  const apiKey = await s.api('POST', '/api-keys/generate', { token: user.token, body: { name: 'deploy pipeline', scopes: ['keys:read'] } });
  ok(apiKey);
  const apiKeyShare = await s.api('POST', `/api-keys/${apiKey.body.key_id}/share`, { token: user.token, body: { expires_in_hours: 24, max_views: 1 } });
  ok(apiKeyShare);
  // The pages a share link opens in a browser (api/share-page.ts), and the one a dead link opens.
  sharePages = {
    'share-key': `/api/v1/keys/share/${keyShare.body.share_token}`,
    'share-api-key': new URL(apiKeyShare.body.url).pathname,
    'share-unknown': `/api/v1/keys/share/${'x'.repeat(43)}`,
  };
  ok(await s.api('POST', '/webhooks', { token: user.token, body: { url: 'http://127.0.0.1:9/a/rather/long/webhook/path/for/the/receiver' } }));
  ok(await s.api('POST', '/organization/invitations', { token: user.token, body: { email: 'new.teammate.with.a.long.address@example.test' } }));

  admin = await registerUser(s.api, { username: 'layout_admin' });
  await s.c.db('users').where({ id: admin.id }).update({ role: 'admin' }); // as `npm run admin -- grant` does
  // A job no worker can do: failed for good at once, with its reason, for the queue view to show and retry.
  const job = await s.c.jobs.queue('maintenance').add('no-such-job', { payload: {}, meta: { enqueued_at: new Date().toISOString() } });
  failedJob = job.id!;
  for (let tries = 0; !(await job.isFailed()); tries++) {
    if (tries > 150) throw new Error('the failing job did not fail');
    await new Promise((r) => setTimeout(r, 100));
  }
}, 60_000);
afterAll(async () => {
  await context?.close();
  await s?.stop();
  if (work) await rm(work, { recursive: true, force: true });
});

/** Serious and critical axe-core findings on the page (evaluated through DevTools, which the CSP does not govern). */
async function axeFindings(page: Page): Promise<string[]> {
  await page.evaluate(AXE);
  // A string: the test's TypeScript has no DOM types; this runs in the page.
  return page.evaluate<string[]>(`axe.run().then((r) => r.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => v.id + ': ' + v.nodes.map((n) => n.target.join(' ')).join(', ')))`);
}

/** The page's width beyond the screen's (0 when none), and the widest elements that stick out. */
const overflow = (page: Page) =>
  page.evaluate<{ scroll: number; viewport: number; culprits: string[] }>(`(() => {
    const viewport = document.documentElement.clientWidth;
    const culprits = [...document.querySelectorAll('body *')]
      .filter((e) => e.getBoundingClientRect().right > viewport + 1)
      .slice(0, 5)
      .map((e) => e.tagName.toLowerCase() + (e.className ? '.' + String(e.className).split(' ')[0] : '') + ' ' + Math.round(e.getBoundingClientRect().right) + 'px');
    return { scroll: document.documentElement.scrollWidth, viewport, culprits };
  })()`);

/** Opens a page, waits until it has drawn what its requests brought, and checks width and axe. */
async function check(page: Page, width: number, name: string, problems: string[]): Promise<void> {
  await page.locator('main h1').first().waitFor({ timeout: 15_000 });
  // /activity keeps an EventSource open: the network never goes idle there; its lists have loaded by then.
  await page.waitForLoadState('networkidle', { timeout: 2_500 }).catch(() => undefined);
  if (SHOTS) await page.screenshot({ path: join(SHOTS, `${width}-${name}.png`), fullPage: true });
  const o = await overflow(page);
  if (o.scroll > o.viewport) problems.push(`${name} at ${width}px is ${o.scroll}px wide: ${o.culprits.join(', ')}`);
  for (const v of await axeFindings(page)) problems.push(`${name} at ${width}px: ${v}`);
}

const nameOf = (path: string) => (path === '/' ? 'root' : path.slice(1));

describe('the console at 390 and 1280 px', { timeout: 150_000 }, () => {
  it('covers every page of the console', () => {
    expect([...SIGNED_OUT, ...USER, ...ADMIN].sort()).toEqual([...CONSOLE_PATHS].sort());
  });

  for (const width of WIDTHS) {
    it(`at ${width} px: every page fits the screen, axe finds nothing serious, nothing leaves the origin`, async () => {
      const problems: string[] = [];
      const page = await context.newPage();
      await page.setViewportSize({ width, height: 900 });
      page.on('pageerror', (e) => problems.push(`script error: ${e.message}`));
      try {
        await signInAs(undefined);
        for (const path of SIGNED_OUT) {
          await page.goto(origin + path);
          await check(page, width, nameOf(path), problems);
        }
        for (const [name, path] of Object.entries(sharePages)) {
          await page.goto(origin + path);
          await check(page, width, name, problems);
        }
        await signInAs(user.token);
        for (const path of USER) {
          await page.goto(origin + path);
          await check(page, width, nameOf(path), problems);
        }
        // A key's details: generations, schedule, history and share links.
        await page.goto(`${origin}/keys`);
        await page.getByRole('button', { name: /^Details of Production encryption key/ }).click();
        await page.locator('table.generations').waitFor({ timeout: 15_000 });
        await check(page, width, 'keys-details', problems);

        await signInAs(admin.token);
        await page.goto(`${origin}/admin`);
        await check(page, width, 'admin', problems);
        await page.getByRole('button', { name: 'Jobs of maintenance' }).click();
        await page.locator(`tr[data-job="${failedJob}"]`).waitFor({ timeout: 15_000 });
        await check(page, width, 'admin-queue-jobs', problems);
      } catch (err) {
        await screenshot(page, `layout-${width}`).catch(() => undefined);
        throw err;
      } finally {
        await page.close();
      }
      expect(problems).toEqual([]);
      expect(foreign).toEqual([]);
    });
  }

  it('on a phone, the navigation reaches every page of a signed-in user', async () => {
    const page = await context.newPage();
    await page.setViewportSize({ width: 390, height: 800 });
    await signInAs(user.token);
    await page.goto(`${origin}/keys`);
    const nav = page.getByRole('navigation', { name: 'Console' });
    for (const [name, path] of [
      ['Files', '/files'],
      ['Activity', '/activity'],
      ['Credentials', '/credentials'],
      ['Team and billing', '/team'],
      ['Profile', '/profile'],
      ['Keys', '/keys'],
    ]) {
      await nav.getByRole('link', { name }).click();
      await expect.poll(() => page.url()).toBe(origin + path);
      await expect.poll(() => nav.getByRole('link', { name }).getAttribute('aria-current')).toBe('page');
    }
    await page.close();
  });

  it("the queue view shows a failed job's reason, and its retry runs it again", async () => {
    const page = await context.newPage();
    await signInAs(admin.token);
    await page.goto(`${origin}/admin`);
    await page.getByRole('button', { name: 'Jobs of maintenance' }).click();
    const row = page.locator(`tr[data-job="${failedJob}"]`);
    await expect.poll(() => row.innerText(), { timeout: 15_000 }).toMatch(/no job "no-such-job" on queue "maintenance"/);
    const before = (await s.c.jobs.queue('maintenance').getJob(failedJob))!.attemptsMade;
    await row.getByRole('button', { name: `Retry job ${failedJob}` }).click();
    await expect.poll(() => page.locator('main').innerText()).toMatch(new RegExp(`Job ${failedJob} is back in the queue maintenance`));
    await expect.poll(async () => (await s.c.jobs.queue('maintenance').getJob(failedJob))!.attemptsMade, { timeout: 15_000 }).toBe(before + 1);
    // A user is not shown the page, and the API refuses them.
    await signInAs(user.token);
    await page.goto(`${origin}/admin`);
    await expect.poll(() => page.locator('main').innerText()).toMatch(/for administrators/);
    expect((await s.api('GET', '/admin/queues', { token: user.token })).status).toBe(403);
    await page.close();
    expect(foreign).toEqual([]);
  });
});
