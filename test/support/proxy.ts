import { createServer, connect, type Socket } from 'node:net';

/** A TCP proxy on loopback that a test can cut, to see how the service behaves when a dependency dies. */
export async function startProxy(targetHost: string, targetPort: number) {
  const sockets = new Set<Socket>();
  let up = true;
  const server = createServer((client) => {
    if (!up) return client.destroy();
    const upstream = connect(targetPort, targetHost);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => undefined);
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as { port: number }).port,
    /** Drops every connection and refuses new ones. */
    cut() {
      up = false;
      for (const s of sockets) s.destroy();
    },
    restore() {
      up = true;
    },
    close: () => new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    }),
  };
}
