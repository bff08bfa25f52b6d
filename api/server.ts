import { createServer, type Server } from 'node:http';
import type { Container } from '../lib/container';
import { createApp } from './app';

export interface WebServer {
  server: Server;
  port: number;
  close(): Promise<void>;
}

export async function startWeb(c: Container, port = c.config.port): Promise<WebServer> {
  const app = createApp(c);
  const server = createServer(app.callback());
  // Uploads of large files take long: no whole-request timeout, but idle sockets are closed.
  server.requestTimeout = 0;
  server.headersTimeout = 60_000;
  server.keepAliveTimeout = 65_000;
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
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeIdleConnections();
      }),
  };
}
