/**
 * Event delivery latency with 100 live SSE clients (bench/lib/events.ts), on its own: one API process.
 * `npm run bench -- --only events` runs the same measurement inside the full bench.
 *
 *   npm run bench:events -- [--clients N] [--events N]     (default 100 clients, 200 events)
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { eventLatencyLine, measureEventLatency } from './lib/events';
import { Service } from './lib/service';
import { GiB } from './lib/util';

const arg = (name: string, def: number) => {
  const at = process.argv.indexOf(name);
  const n = at >= 0 ? Number(process.argv[at + 1]) : def;
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} needs a positive integer`);
  return n;
};
const dir = await mkdtemp(join(tmpdir(), 'kms-bench-events-'));
const service = new Service(dir, GiB);
try {
  await service.startWeb();
  const result = await measureEventLatency(service.baseUrl, service.redisPrefix, {
    clients: arg('--clients', 100),
    events: arg('--events', 200),
    intervalMs: 10,
  });
  console.log(eventLatencyLine(result));
  console.log(JSON.stringify({ bench: 'events', ...result }));
} finally {
  await service.stop();
  await rm(dir, { recursive: true, force: true });
}
