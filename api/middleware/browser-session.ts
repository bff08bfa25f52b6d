import type { AppContext } from '../context';
import { forbidden } from '../../lib/errors';

/**
 * The console's session: the JWT from a sign-in, kept by the browser in an HttpOnly cookie (script in
 * the page cannot read it, so nothing secret lives in localStorage) that is SameSite=Strict and Secure
 * over https. A cookie rides along with requests the browser makes on its own (a form another site
 * posts, an <img>), so a request that may change state (any method but GET and HEAD) is accepted with
 * it only from the console's own script: it must carry the CONSOLE_HEADER (a header a cross-site page
 * cannot send without a CORS preflight, which this service never grants). SameSite=Strict already keeps
 * the cookie off requests other sites start; the header is the second, independent defence. Reads (GET,
 * HEAD) need no header, so the browser itself can download a job's output to disk or follow /events,
 * and another site cannot read their answers (same-origin policy, no CORS). An Origin header, when the
 * browser sends one, must be this service's. Requests with an Authorization header ignore the cookie:
 * the Bearer contract is unchanged.
 */
const SESSION_COOKIE = 'kms_session';
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
  const reading = ctx.method === 'GET' || ctx.method === 'HEAD';
  if (!reading && ctx.get(CONSOLE_HEADER) !== '1')
    throw forbidden('console_header_missing', `A request signed in by the console's cookie must carry the header "${CONSOLE_HEADER}: 1".`);
  const origin = ctx.get('origin');
  // The request's own origin from protocol and host (Koa's ctx.origin echoes the Origin header when sent).
  if (origin && origin !== `${ctx.protocol}://${ctx.host}` && origin !== new URL(ctx.container.config.publicUrl).origin) {
    throw forbidden('cross_origin_request', "A request signed in by the console's cookie must come from the service's own origin.");
  }
  return { token, via: 'cookie' };
}

const cookieOptions = (ctx: AppContext) => ({ httpOnly: true, sameSite: 'strict' as const, path: '/', secure: ctx.secure, overwrite: true });

/** Keeps a session token in the console's cookie for as long as the token lives. */
export function setSessionCookie(ctx: AppContext, token: string, maxAgeSeconds: number): void {
  ctx.cookies.set(SESSION_COOKIE, token, { ...cookieOptions(ctx), maxAge: maxAgeSeconds * 1000 });
}

export function clearSessionCookie(ctx: AppContext): void {
  ctx.cookies.set(SESSION_COOKIE, null, cookieOptions(ctx));
}
