import type { AppContext } from '../context';
import { forbidden } from '../../lib/errors';

/**
 * The console's session: the JWT from a sign-in, kept by the browser in an HttpOnly cookie (script in
 * the page cannot read it, so nothing secret lives in localStorage) that is SameSite=Strict and Secure
 * over https. A cookie rides along with requests the browser makes on its own (a form another site
 * posts, an <img>), so a request that may change state is accepted with it only when it comes from the
 * service's own page (`refuseForgedRequest`). Reads (GET, HEAD) need nothing more, so the browser itself
 * can download a job's output to disk or follow /events, and another site cannot read their answers
 * (same-origin policy, no CORS). Requests with an Authorization header ignore the cookie: the Bearer
 * contract is unchanged.
 */
export const SESSION_COOKIE = 'kms_session';
export const CONSOLE_HEADER = 'x-kms-console';

export interface PresentedCredential {
  token: string;
  via: 'bearer' | 'cookie';
}

/** The credential a request presents: its Bearer token, else the console's session cookie (checked). */
export function presentedCredential(ctx: AppContext): PresentedCredential | undefined {
  const header = ctx.get('authorization');
  if (header) {
    const match = /^Bearer\s+(\S+)$/i.exec(header);
    return match ? { token: match[1], via: 'bearer' } : undefined;
  }
  const token = ctx.cookies.get(SESSION_COOKIE);
  if (!token) return undefined;
  refuseForgedRequest(ctx, 'console-header');
  return { token, via: 'cookie' };
}

/**
 * What proves that a request signed in by a cookie of ours was sent by the service's own page rather
 * than by the browser on another site's behalf:
 * - `console-header`: the console's script sends CONSOLE_HEADER, a header a cross-site page cannot send
 *   without a CORS preflight, which this service never grants;
 * - `browser-origin`: a page that is not ours to change (the queue dashboard's) sends no header of ours,
 *   so the browser's own statement of where the request comes from is required instead: an Origin or
 *   Sec-Fetch-Site header (every browser sends one with a request that is not GET or HEAD).
 * Either way, a Sec-Fetch-Site other than `same-origin` and an Origin other than the service's own are
 * refused. SameSite=Strict is the first defence; this is the second, independent one. GET and HEAD
 * change nothing and pass.
 */
export function refuseForgedRequest(ctx: AppContext, proof: 'console-header' | 'browser-origin'): void {
  if (ctx.method === 'GET' || ctx.method === 'HEAD') return;
  if (proof === 'console-header' && ctx.get(CONSOLE_HEADER) !== '1')
    throw forbidden('console_header_missing', `A request signed in by the console's cookie must carry the header "${CONSOLE_HEADER}: 1".`);
  const site = ctx.get('sec-fetch-site');
  if (site && site !== 'same-origin') throw forbidden('cross_site_request', "A request signed in by a cookie must come from the service's own pages.");
  const origin = ctx.get('origin');
  // The request's own origin from protocol and host (Koa's ctx.origin echoes the Origin header when sent).
  if (origin && origin !== `${ctx.protocol}://${ctx.host}` && origin !== new URL(ctx.container.config.publicUrl).origin)
    throw forbidden('cross_origin_request', "A request signed in by a cookie must come from the service's own origin.");
  if (proof === 'browser-origin' && !origin && !site)
    throw forbidden('origin_required', "A change signed in by the dashboard's cookie must say where it comes from (an Origin or Sec-Fetch-Site header).");
}

const cookieOptions = (ctx: AppContext) => ({ httpOnly: true, sameSite: 'strict' as const, path: '/', secure: ctx.secure, overwrite: true });

/** Keeps a session token in the console's cookie for as long as the token lives. */
export function setSessionCookie(ctx: AppContext, token: string, maxAgeSeconds: number): void {
  ctx.cookies.set(SESSION_COOKIE, token, { ...cookieOptions(ctx), maxAge: maxAgeSeconds * 1000 });
}

export function clearSessionCookie(ctx: AppContext): void {
  ctx.cookies.set(SESSION_COOKIE, null, cookieOptions(ctx));
}
