import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type Koa from 'koa';
import type { Container } from '../lib/container';
import type { AppState } from './route';

/**
 * Pages the API serves outside /api/v1: the passkey sign-in page (`/passkeys`). Plain files read once
 * at start, no build step: the HTML, one script, one stylesheet, an icon, and @simplewebauthn/browser's UMD
 * bundle straight from node_modules (global `SimpleWebAuthnBrowser`). The page talks to /api/v1 from
 * the same origin; its Content-Security-Policy allows scripts, styles and requests from that origin
 * only (no inline script, no eval, no frames), and no form is ever submitted by the browser itself.
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
}

const WEB = join(dirname(fileURLToPath(import.meta.url)), '..', 'web', 'passkeys');

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

export function mountPages(app: Koa<AppState, { container: Container }>): void {
  const assets = passkeyPage();
  app.use(async (ctx, next) => {
    const asset = (ctx.method === 'GET' || ctx.method === 'HEAD') && assets.get(ctx.path);
    if (!asset) return next();
    ctx.set(PAGE_HEADERS);
    ctx.type = asset.type;
    ctx.body = asset.body;
  });
}
