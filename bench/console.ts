/**
 * The web console's budget: its JavaScript gzipped (the build refuses more than 150 KiB) and the time
 * to a first interactive page against a local service (the target is under 1 s), in Debian's Chromium
 * through playwright-core. "Interactive": the page's form control is in the DOM and enabled, i.e. the
 * bundle loaded, ran, asked the API who is signed in and rendered. Measured from the navigation's
 * start (Navigation Timing), cold (a fresh browser context: nothing cached) and warm (the same context
 * again), signed out (/sign-in) and signed in (/keys, which also lists the keys). Not a test.
 *
 *   npm run bench:console -- [--runs N]   (default 7; medians printed)
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { gzipSync } from 'node:zlib';
import { chromium, type Browser, type BrowserContext } from 'playwright-core';
import { buildConsole } from '../scripts/build-console.mjs';
import { Service } from './lib/service';

const REPO = resolve(import.meta.dirname, '..');
const runsArg = process.argv.indexOf('--runs');
const RUNS = runsArg > 0 ? Number(process.argv[runsArg + 1]) : 7;
const say = (text: string) => process.stderr.write(`bench:console ${text}\n`);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** Milliseconds from navigation start until `selector` is present and enabled. */
async function interactive(context: BrowserContext, url: string, selector: string): Promise<number> {
  const page = await context.newPage();
  await page.goto(url, { waitUntil: 'commit' });
  await page.waitForSelector(`${selector}:not([disabled])`, { timeout: 10_000 });
  const ms = await page.evaluate<number>('performance.now()');
  await page.close();
  return ms;
}

const dir = await mkdtemp(join(tmpdir(), 'kms-bench-console-'));
const service = new Service(dir, 1 << 30);
let browser: Browser | undefined;
try {
  // The same bundle the build serves (dist/console), measured as it goes over the wire.
  const sizes = await buildConsole(join(REPO, 'dist', 'console'));
  const js = await readFile(join(REPO, 'dist', 'console', 'app.js'));
  const css = await readFile(join(REPO, 'web', 'console', 'app.css'));
  say('starting the service');
  await service.startWeb();
  browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  const base = service.baseUrl;
  const reg = await fetch(`${base}/api/v1/partners/register`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'bench_console', email: 'bench-console@example.com', password: 'bench console password' }),
  });
  const token = ((await reg.json()) as { session: { token: string } }).session.token;
  const cookie = (await fetch(`${base}/api/v1/auth/session`, { method: 'POST', headers: { authorization: `Bearer ${token}` } })).headers
    .get('set-cookie')!
    .split(';')[0];
  const [name, value] = cookie.split('=') as [string, string];

  const cold = { signedOut: [] as number[], signedIn: [] as number[] };
  const warm = { signedOut: [] as number[], signedIn: [] as number[] };
  say(`${RUNS} runs`);
  for (let i = 0; i < RUNS; i++) {
    const out = await browser.newContext();
    cold.signedOut.push(await interactive(out, `${base}/sign-in`, 'form button[type=submit]'));
    warm.signedOut.push(await interactive(out, `${base}/sign-in`, 'form button[type=submit]'));
    await out.close();
    const inside = await browser.newContext();
    await inside.addCookies([{ name, value, url: base, httpOnly: true, sameSite: 'Strict' }]);
    cold.signedIn.push(await interactive(inside, `${base}/keys`, 'form button[type=submit]'));
    warm.signedIn.push(await interactive(inside, `${base}/keys`, 'form button[type=submit]'));
    await inside.close();
  }
  const f = (xs: number[]) => `${median(xs).toFixed(0)} ms`;
  console.log(
    `console bundle: app.js ${(sizes.bytes / 1024).toFixed(1)} KiB, ${(sizes.gzip / 1024).toFixed(1)} KiB gzipped (budget 150 KiB); app.css ${(gzipSync(css).length / 1024).toFixed(1)} KiB gzipped; JS+CSS as served (gzip) ${((gzipSync(js).length + gzipSync(css).length) / 1024).toFixed(1)} KiB gzipped`,
  );
  console.log(`first page interactive, signed out (/sign-in): cold ${f(cold.signedOut)}, warm ${f(warm.signedOut)} (median of ${RUNS})`);
  console.log(`first page interactive, signed in (/keys, with the key list): cold ${f(cold.signedIn)}, warm ${f(warm.signedIn)} (median of ${RUNS})`);
} finally {
  await browser?.close();
  await service.stop();
  await rm(dir, { recursive: true, force: true });
}
