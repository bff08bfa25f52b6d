import { createHash } from 'node:crypto';
import type { AppContext } from './context';
import { AppError } from '../lib/errors';

/**
 * The small HTML pages a share link answers a browser (`Accept: text/html` preferred over JSON): the
 * shared public key, or an API-key share's Reveal form and the value it revealed, or why the link does
 * not open. One inline stylesheet and no script: the Content-Security-Policy allows that stylesheet by
 * its hash and nothing else (no requests at all; the Reveal form posts only to this origin). Every value
 * from the database or the request is escaped where it is written.
 */

const STYLE = `body{font-family:system-ui,sans-serif;color:#1b1f24;background:#fff;margin:0;padding:1rem;line-height:1.45}
main{max-width:44rem;margin:0 auto}h1{font-size:1.35rem;margin:.2rem 0 1rem}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1rem;margin:0 0 1rem}dt{color:#57606a}dd{margin:0;overflow-wrap:anywhere}
code,pre{font-family:ui-monospace,monospace;font-size:.9rem}pre{background:#f6f8fa;border:1px solid #d0d7de;padding:.6rem;overflow-x:auto;white-space:pre-wrap;overflow-wrap:anywhere}
.fp{letter-spacing:.02em;word-spacing:.3em}a,button{color:#0b5cad}
button,.button{display:inline-block;font:inherit;padding:.45rem .9rem;border:1px solid #0b5cad;border-radius:4px;background:#0b5cad;color:#fff;text-decoration:none;cursor:pointer}
.note{color:#57606a;font-size:.9rem}.bad{color:#b42318}`;

const styleHash = createHash('sha256').update(STYLE).digest('base64');

/** A page may post a form to its own origin (the Reveal button) or to nowhere. */
function csp(forms: boolean): string {
  return [
    "default-src 'none'",
    `style-src 'sha256-${styleHash}'`,
    "img-src 'none'",
    "base-uri 'none'",
    `form-action ${forms ? "'self'" : "'none'"}`,
    "frame-ancestors 'none'",
  ].join('; ');
}

const ESCAPES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
/** Text for HTML element content and quoted attribute values. */
const escapeHtml = (value: string) => value.replace(/[&<>"']/g, (ch) => ESCAPES[ch]);

/** A fingerprint as people compare it: upper case, in groups of four. */
const groupedFingerprint = (fingerprint: string) => fingerprint.toUpperCase().replace(/(.{4})(?=.)/g, '$1 ');

/** Whether the client prefers a page to JSON (a browser does; a client sending no Accept does not). */
export const wantsPage = (ctx: AppContext) => ctx.accepts('application/json', 'text/html') === 'text/html';

/** A row of facts: term, and its value already escaped (or markup made of escaped parts). */
type Fact = [term: string, html: string];

const factList = (facts: Fact[]) => `<dl>${facts.map(([t, d]) => `<dt>${escapeHtml(t)}</dt><dd>${d}</dd>`).join('')}</dl>`;

/** Answers the page: status, the policy, and the headers every share-link answer carries. */
export function sendPage(ctx: AppContext, page: { status?: number; title: string; body: string; forms?: boolean; headers?: Record<string, string> }) {
  ctx.status = page.status ?? 200;
  ctx.set({
    ...page.headers,
    'Content-Security-Policy': csp(page.forms ?? false),
    'Cache-Control': 'no-store',
    'X-Frame-Options': 'DENY',
    'X-Content-Type-Options': 'nosniff',
  });
  ctx.type = 'text/html; charset=utf-8';
  ctx.body = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex, nofollow"><title>${escapeHtml(page.title)}</title><style>${STYLE}</style></head>
<body><main>${page.body}</main></body></html>
`;
}

/**
 * Runs a page's work; an AppError it throws (404 unknown, 410 revoked, expired or used up, 429) becomes
 * an error page with the same status and headers (Retry-After) instead of the JSON problem.
 */
export async function withErrorPage(ctx: AppContext, headers: Record<string, string>, work: () => Promise<void>): Promise<void> {
  try {
    await work();
  } catch (err) {
    if (!(err instanceof AppError) || err.status >= 500) throw err;
    sendPage(ctx, {
      status: err.status,
      title: 'This link does not open',
      headers: { ...headers, ...err.extra.headers },
      body: `<h1>This link does not open</h1><p class="bad">${escapeHtml(err.message)}</p><p class="note">Ask whoever sent it for a new link. (${escapeHtml(err.code)})</p>`,
    });
  }
}

const when = (iso: string | null, none: string) =>
  iso ? `<time datetime="${escapeHtml(iso)}">${escapeHtml(iso.replace('T', ' ').slice(0, 16))} UTC</time>` : escapeHtml(none);

/** The page of a public key share: whose key, its fingerprint, expiry, the `.asc` download (`?format=asc`) and the import line. */
export function publicKeyPage(
  shared: {
    fingerprint: string;
    label: string;
    uid: string;
    algorithm: string;
    expires_at: string | null;
    share_expires_at: string | null;
    views_remaining: number | null;
    public_key: string;
  },
  url: string,
) {
  const asc = `${url}?format=asc`;
  const facts: Fact[] = [
    ['Key of', escapeHtml(shared.uid)],
    ['Label', escapeHtml(shared.label)],
    ['Fingerprint', `<code class="fp">${escapeHtml(groupedFingerprint(shared.fingerprint))}</code>`],
    ['Algorithm', escapeHtml(shared.algorithm)],
    ['Key expires', when(shared.expires_at, 'never')],
    ['Link expires', when(shared.share_expires_at, 'when revoked')],
    ['Views left', escapeHtml(shared.views_remaining === null ? 'unlimited' : String(shared.views_remaining))],
  ];
  return {
    title: `Public key: ${shared.label}`,
    body: `<h1>Public key: ${escapeHtml(shared.label)}</h1>${factList(facts)}
<p><a class="button" href="?format=asc" download="${escapeHtml(shared.fingerprint)}.asc">Download the key (.asc)</a></p>
<p class="note">Each opening of this link, the download included, counts as one view.</p>
<h2>Import it with GnuPG</h2><pre>curl -s '${escapeHtml(asc)}' | gpg --import</pre>
<p class="note">Compare the fingerprint gpg prints with the one above before you trust the key.</p>
<details><summary>The armored key</summary><pre>${escapeHtml(shared.public_key)}</pre></details>`,
  };
}

/** An API-key share before its value is revealed: which key, and the Reveal form (a POST to the page's own address, which spends the view). */
export function apiKeyRevealPage(peek: {
  name: string;
  prefix: string;
  expires_at: string | null;
  share_expires_at: string | null;
  views_remaining: number | null;
}) {
  const facts: Fact[] = [
    ['API key', escapeHtml(peek.name)],
    ['Starts with', `<code>${escapeHtml(peek.prefix)}</code>`],
    ['Key expires', when(peek.expires_at, 'never')],
    ['Link expires', when(peek.share_expires_at, 'when revoked')],
    ['Views left', escapeHtml(peek.views_remaining === null ? 'unlimited' : String(peek.views_remaining))],
  ];
  return {
    title: `API key: ${peek.name}`,
    forms: true,
    body: `<h1>API key shared with you: ${escapeHtml(peek.name)}</h1>${factList(facts)}
<form method="post"><button type="submit">Reveal the key</button></form>
<p class="note">Revealing it spends one view of this link; the value is shown once, on the next page. Copy it somewhere safe.</p>`,
  };
}

/** The value an API-key share revealed (shown once; the page is never cached). */
export function apiKeyValuePage(shared: { name: string; prefix: string; value: string; expires_at: string | null; views_remaining: number | null }) {
  const facts: Fact[] = [
    ['API key', escapeHtml(shared.name)],
    ['Key expires', when(shared.expires_at, 'never')],
    ['Views left', escapeHtml(shared.views_remaining === null ? 'unlimited' : String(shared.views_remaining))],
  ];
  return {
    title: `API key: ${shared.name}`,
    body: `<h1>API key: ${escapeHtml(shared.name)}</h1>${factList(facts)}<pre>${escapeHtml(shared.value)}</pre>
<p class="note">This is the only time this page shows the value; reloading it spends another view. Send it as <code>Authorization: Bearer …</code>.</p>`,
  };
}
