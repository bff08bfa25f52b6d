import Koa from 'koa';
import Router from '@koa/router';
import { koaBody } from 'koa-body';
import type { Container } from '../lib/container';
import { mountRoutes, openApiDocument, type RouteDef } from './route';
import type { AppState } from './context';
import { errorHandler } from './middleware/errors';
import { requestContext } from './middleware/request-context';
import { shedLoad } from './middleware/overload';
import { withRedisBudget } from '../lib/redis';
import authSessionRoutes from './routes/auth/sessions';
import passwordResetRoutes from './routes/auth/password-reset';
import contactRoutes from './routes/auth/contact';
import passkeyRoutes from './routes/auth/passkeys';
import partnerRoutes from './routes/partners/partner-accounts';
import profileRoutes from './routes/profile/account-profile';
import recoveryReviewRoutes from './routes/profile/recovery-review';
import keyMonitoringRoutes from './routes/keys/monitoring';
import keyCatalogRoutes from './routes/keys/catalog';
import keyFileRoutes from './routes/keys/files';
import keyImportRoutes from './routes/keys/import';
import signatureRoutes from './routes/keys/signatures';
import rotationRoutes from './routes/keys/rotation';
import keyLifecycleRoutes from './routes/keys/lifecycle';
import keyShareRoutes from './routes/keys/share';
import apiKeyRoutes from './routes/api-keys/managed-keys';
import apiKeyShareRoutes from './routes/api-keys/shares';
import billingRoutes from './routes/billing/subscription';
import billingWebhookRoutes from './routes/billing/provider-webhook';
import jobRoutes from './routes/jobs/job-results';
import eventRoutes from './routes/events/account-events';
import webhookRoutes from './routes/webhooks/endpoints';
import auditRoutes from './routes/audit-logs/audit-trail';
import teamAccessRoutes from './routes/team-access/team-links';
import organizationRoutes from './routes/organization/membership';
import healthRoutes from './routes/health/health-and-status';
import adminQueueRoutes from './routes/admin/queues';
import { mountPages } from './pages';
import { mountMonitoring } from './monitoring';

export const API_PREFIX = '/api/v1';

/** Every route of the API, in SPEC.md's order; the OpenAPI document is generated from this list. */
export const routes: RouteDef[] = [
  ...authSessionRoutes,
  ...passwordResetRoutes,
  ...contactRoutes,
  ...passkeyRoutes,
  ...partnerRoutes,
  ...profileRoutes,
  ...recoveryReviewRoutes,
  ...keyMonitoringRoutes,
  ...keyCatalogRoutes,
  ...keyFileRoutes,
  ...keyImportRoutes,
  ...signatureRoutes,
  ...rotationRoutes,
  ...keyLifecycleRoutes,
  ...keyShareRoutes,
  ...apiKeyRoutes,
  ...apiKeyShareRoutes,
  ...billingRoutes,
  ...billingWebhookRoutes,
  ...jobRoutes,
  ...eventRoutes,
  ...webhookRoutes,
  ...auditRoutes,
  ...teamAccessRoutes,
  ...organizationRoutes,
  ...healthRoutes,
  ...adminQueueRoutes,
];

export function createApp(container: Container): Koa<AppState, { container: Container }> {
  // Client addresses (limits, audit rows) come from X-Forwarded-For only through the configured number
  // of proxies, right-most first: any client can write the left-most entries.
  const proxies = container.config.trustedProxyCount;
  const app = new Koa<AppState, { container: Container }>({ proxy: proxies > 0, maxIpsCount: proxies });
  app.context.container = container;
  app.silent = true; // errorHandler logs what needs logging

  const router = new Router<AppState, { container: Container }>({ prefix: API_PREFIX });
  const doc = openApiDocument(routes, {
    title: 'Key management and file encryption service',
    version: '1.0.0',
    serverUrl: container.config.publicUrl + API_PREFIX,
  });
  router.get('/openapi.json', (ctx) => {
    ctx.set('Cache-Control', 'public, max-age=300');
    ctx.body = doc;
  });
  mountRoutes(router, routes);
  // Load balancers probe `/health` at the root first: the same route answers there, outside the API's document.
  const root = new Router<AppState, { container: Container }>();
  mountRoutes(
    root,
    healthRoutes.filter((r) => r.path === '/health'),
  );

  app.use(requestContext as Koa.Middleware<AppState, { container: Container }>);
  // One wait for Redis per request, however many commands it sends (docs/operations.md, "Failure behaviour").
  app.use((_ctx, next) => withRedisBudget(next));
  app.use(errorHandler as Koa.Middleware<AppState, { container: Container }>);
  mountMonitoring(app, container);
  app.use(shedLoad(container.config.limits.dbWaiting) as Koa.Middleware<AppState, { container: Container }>);
  // JSON only here; multipart routes parse their own bodies with per-route limits.
  app.use(
    koaBody({
      json: true,
      multipart: false,
      urlencoded: false,
      text: false,
      jsonLimit: container.config.limits.jsonBody,
      jsonStrict: true,
      includeUnparsed: true,
      onError: (err) => {
        throw err;
      },
    }),
  );
  mountPages(app);
  app.use(router.routes());
  app.use(router.allowedMethods());
  app.use(root.routes());
  app.use(root.allowedMethods());
  return app;
}
