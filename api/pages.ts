import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { fileURLToPath } from 'node:url';
import type Koa from 'koa';
import type { Container } from '../lib/container';
import type { AppState } from './context';
import { AppError } from '../lib/errors';
import { CONSOLE_PATHS } from '../web/console/src/paths';

/**
 * Pages the API serves outside /api/v1: the web console (its HTML shell at each of its paths, its
 * stylesheet, and the script `npm run build` bundles into CONSOLE_DIR) and the passkey sign-in page
 * (`/passkeys`: plain files, the HTML, one script, one stylesheet, an icon, and @simplewebauthn/browser's
 * UMD bundle straight from node_modules, global `SimpleWebAuthnBrowser`). Files are read once at start.
 * The pages talk to /api/v1 from the same origin; one Content-Security-Policy for all of them allows
 * scripts, styles and requests from that origin only (no inline script, no eval, no frames), and no form
 * is ever submitted by the browser itself.
 */
const CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self'",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

const PAGE_HEADERS: Record<string, string> = {
  'Content-Security-Policy': CSP,
  'Referrer-Policy': 'no-referrer',
  'X-Frame-Options': 'DENY',
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Resource-Policy': 'same-origin',
  'Permissions-Policy': 'publickey-credentials-create=(self), publickey-credentials-get=(self), camera=(), microphone=(), geolocation=()',
};

interface Asset {
  type: string;
  body: Buffer;
  /** The body gzipped once at start, for clients that accept it (the console's script and stylesheet). */
  gzip?: Buffer;
}

const compressed = (type: string, body: Buffer): Asset => ({ type, body, gzip: gzipSync(body, { level: 9 }) });

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const WEB = join(ROOT, 'web', 'passkeys');
const CONSOLE_WEB = join(ROOT, 'web', 'console');

/** The browser library's bundle, found through Node's resolution so a hoisted or nested install both work. */
function webauthnBundle(): Buffer {
  const entry = createRequire(import.meta.url).resolve('@simplewebauthn/browser'); // …/browser/script/index.js
  return readFileSync(join(dirname(entry), '..', 'dist', 'bundle', 'index.umd.min.js'));
}

function passkeyPage(): Map<string, Asset> {
  const html = { type: 'text/html; charset=utf-8', body: readFileSync(join(WEB, 'index.html')) };
  return new Map([
    ['/passkeys', html],
    ['/passkeys/', html],
    ['/passkeys/app.js', { type: 'text/javascript; charset=utf-8', body: readFileSync(join(WEB, 'app.js')) }],
    ['/passkeys/app.css', { type: 'text/css; charset=utf-8', body: readFileSync(join(WEB, 'app.css')) }],
    ['/passkeys/icon.svg', { type: 'image/svg+xml', body: readFileSync(join(WEB, 'icon.svg')) }],
    ['/passkeys/simplewebauthn-browser.js', { type: 'text/javascript; charset=utf-8', body: webauthnBundle() }],
  ]);
}

/**
 * The console: one HTML shell at every path of CONSOLE_PATHS (the script routes in the page), its
 * stylesheet, and the bundle. Without a build the shell paths answer 503 with what to run.
 */
function consolePages(dir: string): Map<string, Asset> | undefined {
  const script = join(dir, 'app.js');
  if (!existsSync(script)) return undefined;
  const html = { type: 'text/html; charset=utf-8', body: readFileSync(join(CONSOLE_WEB, 'index.html')) };
  return new Map<string, Asset>([
    ...CONSOLE_PATHS.map((p): [string, Asset] => [p, html]),
    ['/console/app.js', compressed('text/javascript; charset=utf-8', readFileSync(script))],
    ['/console/app.css', compressed('text/css; charset=utf-8', readFileSync(join(CONSOLE_WEB, 'app.css')))],
    ['/console/icon.svg', { type: 'image/svg+xml', body: readFileSync(join(WEB, 'icon.svg')) }],
  ]);
}

const CONSOLE_SHELLS = new Set<string>(CONSOLE_PATHS);

export function mountPages(app: Koa<AppState, { container: Container }>): void {
  const { consoleDir } = app.context.container.config;
  const dir = consoleDir ?? join(ROOT, 'dist', 'console');
  const consoleAssets = consolePages(dir);
  const assets = new Map([...(consoleAssets ?? []), ...passkeyPage()]);
  app.use(async (ctx, next) => {
    if (ctx.method !== 'GET' && ctx.method !== 'HEAD') return void (await next());
    const asset = assets.get(ctx.path);
    if (!asset) {
      if (!consoleAssets && CONSOLE_SHELLS.has(ctx.path))
        throw new AppError(503, 'console_not_built', `The web console is not built (no ${join(dir, 'app.js')}); run "npm run build".`);
      return void (await next());
    }
    ctx.set(PAGE_HEADERS);
    ctx.set('Cache-Control', 'no-cache');
    ctx.type = asset.type;
    if (asset.gzip) ctx.vary('Accept-Encoding');
    if (asset.gzip && ctx.acceptsEncodings('gzip', 'identity') === 'gzip') {
      ctx.set('Content-Encoding', 'gzip');
      ctx.body = asset.gzip;
    } else {
      ctx.body = asset.body;
    }
  });
}
