import { createServer, type Server } from 'node:http';
import type { Container } from '../lib/container';
import { metricsAccess, scrapeMetrics } from '../lib/metrics';
import { dependencyChecks, keyringCheck } from '../lib/operations/health-checks';

/**
 * A worker process's own small HTTP server (WORKER_HTTP_PORT), without the API's stack: `/healthz`
 * (the process answers), `/readyz` (503 until Postgres and Redis answer; 200 `degraded` while its
 * keyring reload fails) and `/metrics` (its job metrics, behind METRICS_TOKEN as on the API).
 */
export async function startHealthServer(c: Container, port: number): Promise<{ port: number; close: () => Promise<void> }> {
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const send = (status: number, body: string, type = 'application/json') => {
      res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(req.method === 'HEAD' ? undefined : body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, JSON.stringify({ status: 'method_not_allowed' }));
    if (path === '/healthz') return send(200, JSON.stringify({ status: 'ok' }));
    if (path === '/readyz') {
      void dependencyChecks(c).then(({ postgres, redis }) => {
        const ready = postgres === 'up' && redis === 'up';
        const keyring = keyringCheck(c);
        const status = !ready ? 'not_ready' : keyring === 'stale' ? 'degraded' : 'ready';
        send(ready ? 200 : 503, JSON.stringify({ status, checks: { postgres, redis, keyring } }));
      });
      return;
    }
    if (path === '/metrics') {
      const access = metricsAccess(c.config.monitoring.metricsToken, req.headers.authorization);
      if (access !== 200) return send(access, JSON.stringify({ status: access === 404 ? 'not_found' : 'unauthorized' }));
      void scrapeMetrics(c).then(
        ({ contentType, body }) => send(200, body, contentType),
        () => send(500, JSON.stringify({ status: 'error' })),
      );
      return;
    }
    send(404, JSON.stringify({ status: 'not_found' }));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, resolve);
  });
  const address = server.address();
  const actual = typeof address === 'object' && address ? address.port : port;
  c.log.info({ port: actual }, 'worker health server listening');
  return {
    port: actual,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
