import { createServer, connect, type Socket } from 'node:net';

/** A TCP proxy on loopback that a test can cut, to see how the service behaves when a dependency dies. */
export async function startProxy(targetHost: string, targetPort: number) {
  const sockets = new Set<Socket>();
  let up = true;
  let fromClients = 0;
  const server = createServer((client) => {
    if (!up) return client.destroy();
    client.on('data', (chunk: Buffer) => (fromClients += chunk.length));
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
    /** Bytes clients have sent through the proxy so far (to cut an upload part-way). */
    bytesFromClients: () => fromClients,
    /** Drops every connection and refuses new ones. */
    cut() {
      up = false;
      for (const s of sockets) s.destroy();
    },
    restore() {
      up = true;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
