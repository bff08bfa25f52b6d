import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { freePort } from './ports';
import { startTestService, type TestService } from './service';

/** Debian's chromium, which scripts/test-peers.sh installs: playwright-core downloads no browser. */
const CHROMIUM = '/usr/bin/chromium';

/** Headless Chromium with its own profile folder: no sandbox (containers), no GPU, no traffic of its own. */
export function openChromium(profile: string, opts: { viewport: { width: number; height: number }; acceptDownloads?: boolean }): Promise<BrowserContext> {
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: run \`bash scripts/test-peers.sh\` (it installs Debian's chromium)`);
  return chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    ...opts,
  });
}

/**
 * The service on http://localhost:PORT, a secure context a browser (and WebAuthn, as RP id) accepts; `env`
 * gets the origin. Another process may take the port between the probe and the listen: a few tries.
 */
export async function startOnLocalhost(env: (origin: string) => Record<string, string>): Promise<{ s: TestService; origin: string }> {
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const origin = `http://localhost:${port}`;
    try {
      return { s: await startTestService({ env: { PORT: String(port), ...env(origin) } }), origin };
    } catch (err) {
      if (attempt >= 3 || (err as { code?: string }).code !== 'EADDRINUSE') throw err;
    }
  }
}

/** A full-page screenshot in test-artifacts/ (gitignored), for a failing browser test. */
export async function screenshot(page: Page, name: string): Promise<void> {
  const folder = join(process.cwd(), 'test-artifacts');
  await mkdir(folder, { recursive: true });
  await page.screenshot({ path: join(folder, `${name}.png`), fullPage: true });
}
