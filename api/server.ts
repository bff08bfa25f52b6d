import { createServer, type Server, type ServerResponse } from 'node:http';
import type { Container } from '../lib/container';
import { createApp } from './app';
import { endEventStreams } from './routes/events';

export interface WebServer {
  server: Server;
  port: number;
  close(): Promise<void>;
}

/** How long shutdown waits for in-flight requests (a large download, say) before cutting them. */
const SHUTDOWN_GRACE_MS = 30_000;

export async function startWeb(c: Container, port = c.config.port): Promise<WebServer> {
  const app = createApp(c);
  const server = createServer(app.callback());
  // Uploads of large files take long: no whole-request timeout, but idle sockets are closed.
  server.requestTimeout = 0;
  server.headersTimeout = 60_000;
  server.keepAliveTimeout = 65_000;
  const inFlight = new Set<ServerResponse>();
  server.on('request', (_req, res: ServerResponse) => {
    inFlight.add(res);
    res.on('close', () => inFlight.delete(res));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, () => resolve());
  });
  const address = server.address();
  const actual = typeof address === 'object' && address ? address.port : port;
  c.log.info({ port: actual }, 'api listening');
  return {
    server,
    port: actual,
    async close() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      endEventStreams(); // live event streams never end by themselves; clients reconnect elsewhere

      // Let answers in progress finish, then drop keep-alive sockets (idle or half-read) at once.
      const deadline = Date.now() + SHUTDOWN_GRACE_MS;
      while (inFlight.size && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      server.closeAllConnections();
      await closed;
    },
  };
}
