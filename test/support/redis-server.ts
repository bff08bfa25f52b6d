import { spawn, type ChildProcess } from 'node:child_process';
import { Redis } from 'ioredis';
import { freePort } from './ports';

/**
 * A private `redis-server` on a free loopback port, keeping nothing on disk, that a test can freeze
 * (SIGSTOP: connections stay open, nothing answers), thaw, kill and start again empty. The machine's
 * own Redis is never touched.
 */
export async function startRedisServer() {
  const port = await freePort();
  let child: ChildProcess | undefined;
  const start = async () => {
    child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
    await waitForPing(port);
  };
  await start();
  return {
    url: `redis://127.0.0.1:${port}`,
    freeze: () => child?.kill('SIGSTOP'),
    thaw: () => child?.kill('SIGCONT'),
    start,
    async stop() {
      const c = child;
      if (!c || c.exitCode !== null) return;
      c.kill('SIGCONT');
      c.kill('SIGKILL');
      await new Promise((resolve) => c.once('exit', resolve));
    },
  };
}

/** Resolves once a Redis server on `port` answers PING (connections are refused until it listens). */
export async function waitForPing(port: number): Promise<void> {
  const probe = new Redis({ port, host: '127.0.0.1', lazyConnect: true, retryStrategy: () => 50, maxRetriesPerRequest: null });
  probe.on('error', () => undefined); // refused until the server listens
  try {
    await probe.connect().catch(() => undefined);
    await probe.ping();
  } finally {
    probe.disconnect();
  }
}
