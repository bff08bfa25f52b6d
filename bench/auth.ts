/**
 * What authenticating a request costs per credential kind (bench/lib/auth.ts), on its own: one API
 * process. `npm run bench -- --only auth` runs the same measurement inside the full bench.
 *
 *   npm run bench:auth -- [--rate N] [--seconds N] [--rounds N]     (default 500/s, 3 s, 3 rounds)
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { authOverheadLines, measureAuthOverhead } from './lib/auth';
import { Service } from './lib/service';
import { GiB } from './lib/util';

const arg = (name: string, def: number) => {
  const at = process.argv.indexOf(name);
  const n = at >= 0 ? Number(process.argv[at + 1]) : def;
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${name} needs a positive number`);
  return n;
};
// The per-key request budget (600/min by default) would answer most of the load 429.
process.env.API_KEY_RATE_LIMIT_PER_MINUTE ??= '1000000';
const rate = arg('--rate', 500);
const dir = await mkdtemp(join(tmpdir(), 'kms-bench-auth-'));
const service = new Service(dir, GiB);
try {
  await service.startWeb();
  const rows = await measureAuthOverhead(service.baseUrl, { rate, seconds: arg('--seconds', 3), rounds: arg('--rounds', 3) });
  for (const line of authOverheadLines(rows, rate)) console.log(line);
  console.log(JSON.stringify({ bench: 'auth', rate, rows }));
} finally {
  await service.stop();
  await rm(dir, { recursive: true, force: true });
}
