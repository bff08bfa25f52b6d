import { createServer, connect, type Socket } from 'node:net';

/**
 * One loopback endpoint in front of a database, as a managed Postgres offers: it forwards to the current
 * primary, and at failover drops every connection and leads new ones to the promoted standby. No
 * health checks of its own: the test decides when the failure has been "detected".
 */
export async function startTcpSwitch(targetPort: number) {
  const sockets = new Set<Socket>();
  let target = targetPort;
  const server = createServer((client) => {
    const upstream = connect(target, '127.0.0.1');
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => undefined);
    }
    // Either side's end is both sides' end: a half-open connection would leave the client waiting.
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as { port: number }).port,
    /** Drops every connection; new ones go to `port` from now on. */
    switchTo(port: number) {
      target = port;
      for (const s of sockets) s.destroy();
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
