/**
 * Redis memory per queued job and per stored account event (the capacity model in docs/scale-out.md),
 * on a private `redis-server` started and removed here: `used_memory` before and after queueing N
 * encryption jobs (as the API queues them) and publishing N events (as emitEvents publishes them).
 *
 *   npm run bench:redis-memory -- [--jobs N] [--events N] [--accounts N]     (default 20000, 20000, 200)
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:net';
import { JobClient } from '../jobs/client';
import { publishEvents } from '../lib/event-stream';
import { connectRedis, createRedis } from '../lib/redis';

const arg = (name: string, def: number) => {
  const at = process.argv.indexOf(name);
  const n = at >= 0 ? Number(process.argv[at + 1]) : def;
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} needs a positive integer`);
  return n;
};
const jobs = arg('--jobs', 20_000);
const events = arg('--events', 20_000);
const accounts = arg('--accounts', 200);

const port = await new Promise<number>((resolve) => {
  const probe = createServer().listen(0, '127.0.0.1', () => {
    const { port } = probe.address() as { port: number };
    probe.close(() => resolve(port));
  });
});
const server = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
const redis = createRedis({ redisUrl: `redis://127.0.0.1:${port}`, redisClusterNodes: [] }, 'worker');
redis.on('error', () => undefined); // refused until the server listens; ioredis connects again by itself
try {
  await connectRedis(redis).catch(() => connectRedis(redis));
  const used = async () => Number(/used_memory:(\d+)/.exec(await redis.info('memory'))![1]);

  const client = new JobClient(redis, 'kms');
  await client.queue('crypto').waitUntilReady();
  const beforeJobs = await used();
  for (let i = 0; i < jobs; i += 500) {
    await Promise.all(
      Array.from({ length: Math.min(500, jobs - i) }, () => {
        const id = randomUUID();
        return client.enqueue('encrypt-files', { job_id: id }, { jobId: id, meta: { requestId: randomUUID(), ip: '203.0.113.7' } });
      }),
    );
  }
  const perJob = ((await used()) - beforeJobs) / jobs;

  const beforeEvents = await used();
  const users = Array.from({ length: accounts }, () => randomUUID());
  for (let i = 0; i < events; i++) {
    const data = { job_id: randomUUID(), kind: 'encrypt', state: 'completed' };
    await publishEvents(redis, 'kms', users[i % accounts], [{ type: 'jobs.completed', data }], new Date());
  }
  const perEvent = ((await used()) - beforeEvents) / events;

  console.log(
    `Redis memory: ${Math.round(perJob)} B per queued encryption job (${jobs} waiting), ${Math.round(perEvent)} B per stored event (${events} over ${accounts} account streams)`,
  );
  console.log(
    JSON.stringify({ bench: 'redis-memory', bytes_per_queued_job: Math.round(perJob), bytes_per_event: Math.round(perEvent), jobs, events, accounts }),
  );
  await client.close();
} finally {
  redis.disconnect();
  server.kill('SIGKILL');
}
