/**
 * What sealing job blobs at rest costs: the same file put into and read back from the local blob store,
 * plain and through the sealing decorator (AES-256-GCM per 1 MiB chunk), in this process. CPU seconds
 * per GiB and MiB/s, as ratios within one run. Not a test.
 *
 *   npm run bench:sealing -- [size]     (default 1G)
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { LocalBlobStore, type BlobStore } from '../lib/blob';
import { sealedJobBlobs } from '../lib/blob/sealed';
import { createSealer } from '../lib/sealer';
import { GiB, parseSize, writeRandomFile } from './lib/util';

const size = process.argv[2] ? parseSize(process.argv[2]) : GiB;
const dir = await mkdtemp(join(tmpdir(), 'kms-bench-sealing-'));
try {
  const file = join(dir, 'input.bin');
  await writeRandomFile(file, size);
  const plain = new LocalBlobStore(join(dir, 'plain'));
  const sealed = sealedJobBlobs(new LocalBlobStore(join(dir, 'sealed')), createSealer(`b1:${randomBytes(32).toString('base64')}`));
  const sink = () => new Writable({ write: (_c, _e, done) => done() });

  async function measure(store: BlobStore) {
    const key = `jobs/${randomUUID()}/in/0`;
    const t0 = process.hrtime.bigint();
    const c0 = process.cpuUsage();
    await store.put(key, createReadStream(file, { highWaterMark: 1 << 20 }));
    const c1 = process.cpuUsage(c0);
    const t1 = process.hrtime.bigint();
    await pipeline(await store.get(key), sink());
    const c2 = process.cpuUsage();
    const t2 = process.hrtime.bigint();
    const cpu = (u: NodeJS.CpuUsage) => (u.user + u.system) / 1e6;
    const gib = size / GiB;
    return {
      put: { cpuPerGiB: cpu(c1) / gib, mibPerSec: size / 2 ** 20 / (Number(t1 - t0) / 1e9) },
      get: { cpuPerGiB: (cpu(c2) - cpu(c0) - cpu(c1)) / gib, mibPerSec: size / 2 ** 20 / (Number(t2 - t1) / 1e9) },
    };
  }
  // Interleaved, best of three each: this machine's first writes of fresh pages are noisy.
  type Figures = Awaited<ReturnType<typeof measure>>;
  const best = (a: Figures | undefined, b: Figures): Figures =>
    !a ? b : { put: a.put.cpuPerGiB <= b.put.cpuPerGiB ? a.put : b.put, get: a.get.cpuPerGiB <= b.get.cpuPerGiB ? a.get : b.get };
  let p: Figures | undefined;
  let s: Figures | undefined;
  for (let i = 0; i < 3; i++) {
    p = best(p, await measure(plain));
    s = best(s, await measure(sealed));
  }
  if (!p || !s) throw new Error('no runs');
  const f = (n: number) => n.toFixed(2);
  console.log(`blob store, ${size / 2 ** 20} MiB file, local folder`);
  console.log(`            CPU-s/GiB plain → sealed      MiB/s plain → sealed`);
  console.log(`  write     ${f(p.put.cpuPerGiB)} → ${f(s.put.cpuPerGiB)}                 ${f(p.put.mibPerSec)} → ${f(s.put.mibPerSec)}`);
  console.log(`  read      ${f(p.get.cpuPerGiB)} → ${f(s.get.cpuPerGiB)}                 ${f(p.get.mibPerSec)} → ${f(s.get.mibPerSec)}`);
  console.log(JSON.stringify({ size, plain: p, sealed: s }));
} finally {
  await rm(dir, { recursive: true, force: true });
}
