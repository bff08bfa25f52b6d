/**
 * Request and small-job latency (bench/lib/latency.ts), on its own: one API process and one worker.
 * `npm run bench -- --only latency` runs the same measurement inside the full bench.
 *
 *   npm run bench:latency -- [--rate N] [--seconds N] [--jobs N] [--warmup S]     (default 500/s, 5 s, 50 jobs, 10 s)
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { latencyLines, measureListLatency, measureSmallJobs } from './lib/latency';
import { Service } from './lib/service';
import { GiB, fileCreateCost, serviceCpuReader } from './lib/util';

const arg = (name: string, def: number) => {
  const at = process.argv.indexOf(name);
  const n = at >= 0 ? Number(process.argv[at + 1]) : def;
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${name} needs a positive number`);
  return n;
};
const rate = arg('--rate', 500);
const dir = await mkdtemp(join(tmpdir(), 'kms-bench-latency-'));
const service = new Service(dir, GiB);
const creates = [fileCreateCost(dir)];
try {
  await service.startWeb();
  await service.addWorker('crypto=4');
  const list = await measureListLatency(service.baseUrl, { rate, seconds: arg('--seconds', 5), cpu: serviceCpuReader(service) });
  const small = await measureSmallJobs(service.baseUrl, {
    concurrency: [1, 16],
    jobs: arg('--jobs', 50),
    warmupSeconds: arg('--warmup', 10),
    cpu: serviceCpuReader(service),
  });
  creates.push(fileCreateCost(dir));
  for (const line of latencyLines(list, rate, small)) console.log(line);
  console.log(`file creates ${creates.map(Math.round).join(' → ')} µs at the start and the end (bench/README.md, "Files the filesystem hands out")`);
  console.log(JSON.stringify({ bench: 'latency', rate, list, small, file_create_us: creates.map(Math.round) }));
} finally {
  await service.stop();
  await rm(dir, { recursive: true, force: true });
}
