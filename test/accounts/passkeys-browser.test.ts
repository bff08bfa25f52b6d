import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { BrowserContext, Page } from 'playwright-core';
import { openChromium, screenshot, startOnLocalhost } from '../support/browser';
import { registerUser, type TestService } from '../support/service';

/**
 * The passkey page end to end in Debian's Chromium (scripts/test-peers.sh installs it) with a CDP
 * virtual authenticator: password sign-in, register a passkey, rename it, sign out, sign back in with
 * the passkey (discoverable, no username), and the JWT the page got works on GET /auth/me.
 * WebAuthn needs a domain as RP id and a secure context: http://localhost:PORT is both.
 */

let s: TestService;
let origin: string;
let profile: string;
let context: BrowserContext;

beforeAll(async () => {
  ({ s, origin } = await startOnLocalhost((origin) => ({ WEBAUTHN_ORIGINS: origin })));
  profile = await mkdtemp(join(tmpdir(), 'kms-chromium-'));
  context = await openChromium(profile, { viewport: { width: 900, height: 1000 } });
});
afterAll(async () => {
  await context?.close();
  if (profile) await rm(profile, { recursive: true, force: true });
  await s?.stop();
});

async function statusSays(page: Page, pattern: RegExp) {
  await expect.poll(() => page.locator('#status').textContent(), { timeout: 10_000 }).toMatch(pattern);
}

describe('the passkey page in Chromium', () => {
  it('signs in with a password, registers and renames a passkey, signs out, signs back in with the passkey, and the JWT works', async () => {
    const user = await registerUser(s.api);
    const page = context.pages()[0] ?? (await context.newPage());
    const problems: string[] = [];
    page.on('console', (msg) => {
      if (msg.type() === 'error') problems.push(msg.text());
    });
    page.on('pageerror', (err) => problems.push(err.message));
    page.on('response', (r) => {
      if (r.status() >= 400) problems.push(`${r.status()} ${r.url()}`);
    });

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

    const res = await page.goto(`${origin}/passkeys`);
    expect(res?.status()).toBe(200);
    expect(res?.headers()['content-security-policy']).toMatch(/script-src 'self';/);
    expect(res?.headers()['content-security-policy']).not.toMatch(/unsafe-inline|unsafe-eval/);
    await statusSays(page, /Sign in with your password or a passkey/);

    // Password sign-in.
    await page.fill('#identifier', user.username);
    await page.fill('#password', user.password);
    await page.click('#password-login');
    await statusSays(page, new RegExp(`Signed in as ${user.username} with a password`));
    await expect.poll(() => page.locator('#no-passkeys').isVisible()).toBe(true);

    // Register a passkey on the virtual authenticator.
    await page.fill('#passkey-name', 'Chromium virtual');
    await page.click('#add-passkey');
    await statusSays(page, /Passkey "Chromium virtual" added/);
    const { credentials } = await cdp.send('WebAuthn.getCredentials', { authenticatorId });
    expect(credentials).toHaveLength(1);
    expect(credentials[0]).toMatchObject({ isResidentCredential: true, rpId: 'localhost' });
    await expect.poll(() => page.locator('#passkeys li .name').allTextContents()).toEqual(['Chromium virtual']);

    // Rename it in the list.
    await page.fill('#passkeys li form.rename input', 'Renamed in Chromium');
    await page.click('#passkeys li form.rename button');
    await statusSays(page, /Renamed to "Renamed in Chromium"/);

    // Sign out (the server ends the session too), then sign in with the passkey and no username.
    await page.click('#sign-out');
    await statusSays(page, /Signed out/);
    expect(await page.locator('#signed-out').isVisible()).toBe(true);
    await page.fill('#identifier', '');
    const completed = page.waitForResponse((r) => r.url().endsWith('/api/v1/auth/passkeys/login/complete'));
    await page.click('#passkey-login');
    const login = await completed;
    expect(login.status()).toBe(200);
    const { session } = (await login.json()) as { session: { token: string } };
    await statusSays(page, new RegExp(`Signed in as ${user.username} with a passkey`));
    await expect.poll(() => page.locator('#passkeys li .name').allTextContents()).toEqual(['Renamed in Chromium']);

    // The JWT from the passkey login is a session like password login's; the password session was ended.
    const me = await s.api('GET', '/auth/me', { token: session.token });
    expect(me.status).toBe(200);
    expect(me.body).toMatchObject({ user_id: user.id, username: user.username, authenticated_via: 'jwt' });
    expect((await s.api('GET', '/auth/me', { token: user.token })).status).toBe(401);
    const list = await s.api('GET', '/auth/passkeys/list', { token: session.token });
    expect(list.body.items).toMatchObject([{ name: 'Renamed in Chromium', active: true, last_used_at: expect.any(String) }]);
    // The authenticator's signature counter moved with the login.
    const after = await cdp.send('WebAuthn.getCredentials', { authenticatorId });
    expect(after.credentials[0].signCount).toBeGreaterThan(0);

    await screenshot(page, 'passkeys-browser');
    // No CSP violation, script error or failed request on the way.
    expect(problems).toEqual([]);
  });
});
