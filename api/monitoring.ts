import type Koa from 'koa';
import type { Container } from '../lib/container';
import { AppError, notFound, unauthorized } from '../lib/errors';
import { metricsAccess, scrapeMetrics } from '../lib/metrics';
import { QUEUES } from '../jobs/define';
import { authenticate } from './middleware/auth';
import { requireAdmin } from './middleware/admin';
import type { AppContext } from './context';
import { presentedCredential, refuseForgedRequest, SESSION_COOKIE } from './middleware/browser-session';

/** Where the BullMQ dashboard lives, outside /api/v1 (it is a page, not part of the API). */
const DASHBOARD_PATH = '/admin/queues';
const SESSION_PATH = `${DASHBOARD_PATH}/session`;
const COOKIE = 'kms_dashboard';

/** Bull Board's <link> to Google's web fonts (its page falls back to the system's fonts). */
const FOREIGN_STYLESHEET = /<link\b[^>]*href="https?:\/\/[^"]*"[^>]*rel="stylesheet"[^>]*>/g;

/**
 * The dashboard's page may load and ask for nothing beyond the origin. Its React UI sets style attributes
 * (hence 'unsafe-inline' for styles only) and reads its configuration from a JSON data block, not a script.
 */
const DASHBOARD_CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "base-uri 'self'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

type App = Koa<AppContext['state'], { container: Container }>;

/**
 * Operator endpoints beside the API: `GET /metrics` (Prometheus text, METRICS_TOKEN as a Bearer token)
 * and the BullMQ dashboard (@bull-board/koa) for administrators.
 */
export function mountMonitoring(app: App, c: Container): void {
  app.use(async (koaCtx, next) => {
    if (koaCtx.path !== '/metrics') return void (await next());
    const access = metricsAccess(c.config.monitoring.metricsToken, koaCtx.get('authorization'));
    if (access === 404) throw notFound('not_found', 'No such resource.');
    if (access === 401) throw unauthorized('invalid_token', 'Send METRICS_TOKEN as "Authorization: Bearer <token>".');
    if (koaCtx.method !== 'GET' && koaCtx.method !== 'HEAD') throw new AppError(405, 'method_not_allowed', 'Use GET.');
    const { contentType, body } = await scrapeMetrics(c);
    koaCtx.type = contentType;
    koaCtx.body = body;
  });

  const mode = c.config.monitoring.queueDashboard;
  if (mode === 'off') return;
  // Built at the first administrator's request: an API process nobody opens the dashboard on does not
  // load it (~6 MiB), and an unauthenticated request never reaches its code.
  let dashboard: Promise<Koa.Middleware> | undefined;
  const loadDashboard = async (): Promise<Koa.Middleware> => {
    const [{ createBullBoard }, { BullMQAdapter }, { KoaAdapter }] = await Promise.all([
      import('@bull-board/api'),
      import('@bull-board/api/bullMQAdapter'),
      import('@bull-board/koa'),
    ]);
    const board = new KoaAdapter().setBasePath(DASHBOARD_PATH);
    createBullBoard({
      // Read-only unless QUEUE_DASHBOARD=read-write: retries and removals change what workers do.
      queues: QUEUES.map((q) => new BullMQAdapter(c.jobs.queue(q), { readOnlyMode: mode === 'read-only', allowRetries: mode === 'read-write' })),
      serverAdapter: board,
      options: { uiConfig: { boardTitle: 'KMS queues' } },
    });
    return board.registerPlugin();
  };

  app.use(async (koaCtx, next) => {
    if (koaCtx.path !== DASHBOARD_PATH && !koaCtx.path.startsWith(`${DASHBOARD_PATH}/`)) return void (await next());
    const ctx = koaCtx as unknown as AppContext;
    if (ctx.path === SESSION_PATH) return dashboardSession(ctx, c);
    // A browser cannot add a Bearer header to the page's own requests: it sends a session cookie instead
    // (the dashboard's own, or the console's, so a signed-in administrator opens /admin/queues directly),
    // which the browser also attaches to requests other sites make; the dashboard's page sends no header of ours.
    const cookie = ctx.cookies.get(COOKIE) ?? ctx.cookies.get(SESSION_COOKIE);
    if (!ctx.get('authorization') && cookie) {
      refuseForgedRequest(ctx, 'browser-origin');
      ctx.request.headers.authorization = `Bearer ${cookie}`;
    }
    ctx.state.user = await authenticate(ctx, 'session');
    await requireAdmin(ctx, DASHBOARD_PATH);
    ctx.set('X-Frame-Options', 'DENY');
    ctx.set('Content-Security-Policy', DASHBOARD_CSP);
    ctx.set('Referrer-Policy', 'no-referrer');
    const board = await (dashboard ??= loadDashboard());
    await board(koaCtx, next);
    // Its page links a web font from fonts.googleapis.com: nothing the service serves asks another host.
    if (typeof koaCtx.body === 'string' && koaCtx.response.is('html')) koaCtx.body = koaCtx.body.replace(FOREIGN_STYLESHEET, '');
  });
}

/**
 * `POST /admin/queues/session` with an administrator's session token (Bearer, or the console's session
 * cookie with its header: the console opens the dashboard this way) sets it as an HttpOnly,
 * SameSite=Strict cookie scoped to the dashboard, so a browser can open it; `DELETE` clears it. The
 * token is checked on every dashboard request, so logout and password changes end this session too.
 */
async function dashboardSession(ctx: AppContext, c: Container): Promise<void> {
  // `secure` follows the request (X-Forwarded-Proto through TRUSTED_PROXY_COUNT proxies): https in production.
  const cookie = { httpOnly: true, sameSite: 'strict' as const, path: DASHBOARD_PATH, secure: ctx.secure, overwrite: true };
  if (ctx.method === 'DELETE') {
    ctx.cookies.set(COOKIE, null, cookie);
    ctx.status = 204;
    return;
  }
  if (ctx.method !== 'POST') throw new AppError(405, 'method_not_allowed', 'Use POST to open a dashboard session, DELETE to close it.');
  ctx.state.user = await authenticate(ctx, 'session');
  await requireAdmin(ctx, DASHBOARD_PATH);
  const { token } = presentedCredential(ctx)!;
  ctx.cookies.set(COOKIE, token, { ...cookie, maxAge: c.config.jwt.ttlSeconds * 1000 });
  ctx.status = 204;
}
