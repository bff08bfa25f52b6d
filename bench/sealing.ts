/**
 * What sealing job blobs at rest costs, on its own (no service, no gpg): see bench/lib/sealing.ts.
 * `npm run bench -- --only sealing` runs the same measurement inside the full bench.
 *
 *   npm run bench:sealing -- [size] [--runs N]     (default 1G, 3 runs)
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { measureSealing, sealingSummary } from './lib/sealing';
import { GiB, formatSize, parseSize, writeRandomFile } from './lib/util';

const args = process.argv.slice(2);
const runsAt = args.indexOf('--runs');
const runs = runsAt >= 0 ? Number(args.splice(runsAt, 2)[1]) : 3;
if (!Number.isInteger(runs) || runs < 1) throw new Error('--runs needs a positive integer');
const size = args[0] ? parseSize(args[0]) : GiB;
const dir = await mkdtemp(join(tmpdir(), 'kms-bench-sealing-'));
try {
  const input = join(dir, 'input.bin');
  await writeRandomFile(input, size);
  const results = await measureSealing(input, size, dir, runs);
  console.log(`blob store, ${formatSize(size)} random file, local folder in ${tmpdir()}, best of ${runs} (least CPU)`);
  for (const line of sealingSummary(results)) console.log(`  ${line}`);
  console.log(JSON.stringify({ bench: 'sealing', size, runs, results }));
} finally {
  await rm(dir, { recursive: true, force: true });
}
