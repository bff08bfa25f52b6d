/**
 * The service's byte path in one process, without HTTP, Postgres or queues: what a job's bytes cost in
 * CPU (user and system separately) through the same code the service runs. Not a test.
 *   upload    file in 64 KiB reads (as a socket's) → fingerprint (as api/upload.ts) → job-file store as
 *             the service stacks it (followable segments, sealed, local folder)
 *   encrypt   blob → progress count → encryptStream (native SEIPDv1) → output quota → sealed blob
 *   download  sealed blob → a sink (the API's response body)
 *   decrypt   sealed ciphertext blob → progress count → openEncrypted → decrypt → sealed blob (sha256 checked)
 * Each phase runs after `sync`; per phase, the run that used the least CPU is kept. Every phase runs under
 * the worker's node flags and environment from the Procfile (and BENCH_NODE_FLAGS; the API's flags differ in
 * one), the script re-executing itself under them.
 *
 * Prints what a write into the page cache costs the kernel first, as `npm run bench` does (bench/README.md,
 * "Memory the host takes back"): on a host that takes back freed memory it is a large part of every
 * figure's system time.
 *
 *   tsx bench/pipeline.ts [size] [--runs N]        (default 256M, 3 runs)
 */
import { spawnSync } from 'node:child_process';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { PerformanceObserver, constants } from 'node:perf_hooks';
import { join } from 'node:path';
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { LocalBlobStore } from '../lib/blob';
import { followableJobFiles } from '../lib/blob/followable';
import { sealedJobBlobs } from '../lib/blob/sealed';
import { jobDataKeys } from '../lib/blob/data-keys';
import { encryptStream, openEncrypted } from '../lib/pgp/stream';
import { createSealer } from '../lib/sealer';
import { counted } from '../lib/streams';
import { fingerprintAsRead } from '../lib/upload-fingerprint';
import { makePgpKeys } from './lib/baselines';
import { extraFlags, procfileCommand } from './lib/service';
import { GiB, MiB, formatSize, parseSize, run, pageCacheWriteCost, sha256File, writeRandomFile } from './lib/util';

// V8's collector settings move these figures by half (docs/performance.md, "Process flags"): measure
// what a worker runs.
if (!process.env.BENCH_PIPELINE_AS_WORKER) {
  const { env, flags } = procfileCommand('worker');
  const workerFlags = [...flags, ...extraFlags()];
  const child = spawnSync(process.execPath, [...workerFlags, ...process.execArgv, ...process.argv.slice(1)], {
    stdio: 'inherit',
    env: { ...env, ...process.env, BENCH_PIPELINE_AS_WORKER: workerFlags.join(' ') || '(no flags)' },
  });
  process.exit(child.status ?? 1);
}

const args = process.argv.slice(2);
const runsAt = args.indexOf('--runs');
const runs = runsAt >= 0 ? Number(args.splice(runsAt, 2)[1]) : 3;
const size = args[0] ? parseSize(args[0]) : 256 * MiB;

interface Cpu {
  user: number;
  sys: number;
  ms: number;
  /** Garbage collections during the phase: minor (scavenges), major (mark-compact), and their pause ms. */
  gc: { minor: number; major: number; ms: number };
}

const gcSeen = { minor: 0, major: 0, ms: 0 };
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) {
    const kind = (e as unknown as { detail?: { kind?: number } }).detail?.kind;
    if (kind === constants.NODE_PERFORMANCE_GC_MINOR) gcSeen.minor++;
    else if (kind === constants.NODE_PERFORMANCE_GC_MAJOR) gcSeen.major++;
    gcSeen.ms += e.duration;
  }
}).observe({ entryTypes: ['gc'] });

async function timed(work: () => Promise<void>): Promise<Cpu> {
  await run('sync', []);
  const g0 = { ...gcSeen };
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await work();
  const ms = performance.now() - t0;
  const c = process.cpuUsage(c0);
  await new Promise((resolve) => setImmediate(resolve)); // GC entries arrive asynchronously
  const gc = { minor: gcSeen.minor - g0.minor, major: gcSeen.major - g0.major, ms: gcSeen.ms - g0.ms };
  return { user: c.user / 1e6, sys: c.system / 1e6, ms, gc };
}

/** As api/upload.ts with an Idempotency-Key (the client library always sends one): the upload's fingerprint, for replays. */
function fingerprinted(source: Readable, dataKey: Buffer): Readable {
  fingerprintAsRead(source, dataKey, 0, () => undefined);
  return source;
}

const sink = () => new Writable({ write: (_chunk, _enc, done) => done() });
const hashSink = (hash: ReturnType<typeof createHash>) => new Writable({ write: (chunk: Buffer, _enc, done) => (hash.update(chunk), done()) });

const dir = await mkdtemp(join(tmpdir(), 'kms-bench-pipeline-'));
try {
  const pageCache = pageCacheWriteCost(dir);
  const input = join(dir, 'input.bin');
  await writeRandomFile(input, size);
  const inputSha = await sha256File(input);
  const keys = await makePgpKeys();
  // As lib/container.ts stacks it: job files in followable segments, each sealed at rest.
  const jobKeys = jobDataKeys(createSealer(`bench:${randomBytes(32).toString('base64')}`));
  const store = followableJobFiles(sealedJobBlobs(new LocalBlobStore(join(dir, 'blobs')), jobKeys));
  const best: Record<string, Cpu> = {};
  const keep = (k: string, t: Cpu) => {
    if (!best[k] || t.user + t.sys < best[k].user + best[k].sys) best[k] = t;
  };
  let progress = 0;
  for (let i = 0; i < runs; i++) {
    const [job1, job2] = [randomUUID(), randomUUID()];
    jobKeys.mint(job1); // as the API does when a job's upload begins
    keep(
      'upload',
      await timed(
        async () => void (await store.put(`jobs/${job1}/in/0`, fingerprinted(createReadStream(input, { highWaterMark: 64 << 10 }), await jobKeys.get(job1)))),
      ),
    );
    keep(
      'encrypt',
      await timed(async () => {
        const source = counted(await store.get(`jobs/${job1}/in/0`), (n) => (progress = n));
        const out = await encryptStream(source, keys.publicKey, { armor: false, filename: 'input.bin' });
        await store.put(`jobs/${job1}/out/0`, out);
      }),
    );
    keep('download', await timed(async () => pipeline(await store.get(`jobs/${job1}/out/0`), sink())));
    keep(
      'decrypt',
      await timed(async () => {
        const source = counted(await store.get(`jobs/${job1}/out/0`), (n) => (progress = n));
        const message = await openEncrypted(source, { maxDecompressedBytes: 16 * GiB });
        await store.put(`jobs/${job1}/out/1`, await message.decrypt(keys.privateKey));
      }),
    );
    const hash = createHash('sha256');
    await pipeline(await store.get(`jobs/${job1}/out/1`), hashSink(hash));
    if (hash.digest('hex') !== inputSha) throw new Error('decrypted output differs from the input');
    await store.deletePrefix(`jobs/${job1}/`);
    await store.deletePrefix(`jobs/${job2}/`);
  }
  void progress;
  console.log(
    `byte path in one process, ${formatSize(size)} random file, followable sealed local store in ${tmpdir()}, best of ${runs} (least CPU), node ${process.env.BENCH_PIPELINE_AS_WORKER}; CPU s per GiB (page cache writes ${pageCache.toFixed(2)} CPU-s/GiB in the kernel before the run)`,
  );
  const per = (s: number) => (s / (size / GiB)).toFixed(2);
  for (const [k, t] of Object.entries(best)) {
    console.log(
      `  ${k.padEnd(9)} ${per(t.user + t.sys).padStart(5)}  (user ${per(t.user)} + sys ${per(t.sys)})  ${(size / MiB / (t.ms / 1000)).toFixed(0)} MiB/s · GC ${t.gc.minor} minor + ${t.gc.major} major, ${t.gc.ms.toFixed(0)} ms paused`,
    );
  }
  await store.close();
} finally {
  await rm(dir, { recursive: true, force: true });
}
