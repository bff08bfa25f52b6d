import { createServer, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Container } from '../lib/container';
import { createApp } from './app';
import { endEventStreams } from './routes/events/account-events';
import { problemDocument, problemTitle } from './middleware/errors';
import { AppError } from '../lib/errors';

export interface WebServer {
  server: Server;
  port: number;
  close: () => Promise<void>;
}

/** How long shutdown waits for in-flight requests (a large download, say) before cutting them. */
const SHUTDOWN_GRACE_MS = 30_000;

export async function startWeb(c: Container, port = c.config.port): Promise<WebServer> {
  const app = createApp(c);
  const handle = app.callback();
  // Koa's handler answers its own errors (ctx.onerror): the promise it returns never rejects.
  const server = createServer((req, res) => void handle(req, res));
  // Uploads of large files take long: no whole-request timeout, but idle sockets are closed.
  server.requestTimeout = 0;
  server.headersTimeout = 60_000;
  server.keepAliveTimeout = 65_000;
  server.on('clientError', answerUnparsable);
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

/**
 * A request Node's parser refuses before the app sees it (a request line or headers over its limit, bytes
 * that are not HTTP) is answered problem+json like every other error, where Node would send a bare status.
 */
function answerUnparsable(err: NodeJS.ErrnoException, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || !socket.writable) {
    socket.destroy();
    return;
  }
  const problem =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? new AppError(431, 'headers_too_large', 'The request line or headers are larger than this server accepts.')
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? new AppError(408, 'request_timeout', 'The request did not arrive in time.')
        : new AppError(400, 'malformed_request', 'The request is not valid HTTP.');
  const body = JSON.stringify(problemDocument(problem));
  socket.end(
    `HTTP/1.1 ${problem.status} ${problemTitle(problem.status)}\r\nContent-Type: application/problem+json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}
