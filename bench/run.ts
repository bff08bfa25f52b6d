/**
 * Throughput and memory benchmark of the encryption service against gpg and in-process OpenPGP.js,
 * measured in the same run so ratios stay comparable on a shared, noisy machine. Not a test.
 *
 *   npm run bench -- [size] [--only encrypt,decrypt,parallel] [--runs N] [--transfer http|fetch] [--no-json]
 *
 * See bench/README.md.
 */
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { mkdtemp, rm, statfs } from 'node:fs/promises';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Gpg, gpgVersion, makePgpKeys } from './lib/baselines';
import { Api, type Transfer } from './lib/client';
import { cpuPerGiBOf, printReport, ratios, type RssSnapshots } from './lib/report';
import { samplePostgres } from './lib/pg-sampler';
import { decryptSection, encryptSection, parallelSection, rotationSection, type Bench, type Results } from './lib/sections';
import { measureSealing } from './lib/sealing';
import { eventLatencyLine, measureEventLatency } from './lib/events';
import { authOverheadLines, measureAuthOverhead } from './lib/auth';
import { latencyLines, measureListLatency, measureSmallJobs } from './lib/latency';
import { auditSection } from './lib/audit';
import { Service } from './lib/service';
import {
  GiB,
  children,
  formatSize,
  mibPerSec,
  parseSize,
  serviceCpuReader,
  spawnTracked,
  stopChild,
  pageCacheWriteCost,
  fileCreateCost,
  writeRandomFile,
} from './lib/util';

/** `sealing`: the blob store's at-rest sealing alone, in this process (bench/lib/sealing.ts). */
const sealingSection = (b: Bench) => measureSealing(b.input, b.size, b.dir, b.runs);
/** `rewrap`: the service's rewrap and reencrypt in this process (bench/lib/rewrap.ts); imported when it runs. */
const rewrapSection = async (b: Bench) => (await import('./lib/rewrap')).measureRewrap(b.input, b.size, b.dir, b.runs);
/** `shapes`: decrypting each message shape ÷ the common one, in a process under the worker's flags (bench/lib/shapes.ts); imported when it runs. */
const shapesSection = async (b: Bench) => (await import('./lib/shapes')).shapesUnderWorkerFlags(b.input, b.size, b.dir, b.runs);
/** `v6`: a v6 file's round trip through the service ÷ a scripted upload, gpg -e and download (bench/lib/v6.ts); imported when it runs. */
const v6Section = async (b: Bench) => (await import('./lib/v6')).v6Section(b);
/** `signatures`: sign-and-encrypt and verify in this process ÷ gpg -se and gpg --verify (bench/lib/signatures.ts); imported when it runs. */
const signaturesSection = async (b: Bench) => (await import('./lib/signatures')).measureSignatures(b.input, b.size, b.dir, b.runs, b.gpg);
/** `events`: publish → SSE latency with 100 live clients on the API process; printed as it is measured (not a byte rate). */
const eventsSection = async (b: Bench) => {
  console.log(eventLatencyLine(await measureEventLatency(b.service.baseUrl, b.service.redisPrefix, { clients: 100, events: 200, intervalMs: 10 })));
  return {};
};
/** `auth`: GET /auth/me at 500 requests/s with a JWT, the partner key and a managed API key; printed as measured. */
const authSection = async (b: Bench) => {
  for (const line of authOverheadLines(await measureAuthOverhead(b.service.baseUrl, { rate: 500, seconds: 3, rounds: 3 }), 500)) console.log(line);
  return {};
};
/** `latency`: GET /keys/list at 500 requests/s, and 1 KiB encrypt jobs with Prefer: wait at concurrency 1 and 16. */
const latencySection = async (b: Bench) => {
  await b.service.vacuum();
  const list = await measureListLatency(b.service.baseUrl, { rate: 500, seconds: 5, cpu: serviceCpuReader(b.service) });
  for (const line of latencyLines(
    list,
    500,
    await measureSmallJobs(b.service.baseUrl, { concurrency: [1, 16], jobs: 50, warmupSeconds: 10, cpu: serviceCpuReader(b.service) }),
  ))
    console.log(line);
  return {};
};
const SECTIONS = {
  encrypt: encryptSection,
  decrypt: decryptSection,
  parallel: parallelSection,
  rotation: rotationSection,
  sealing: sealingSection,
  rewrap: rewrapSection,
  shapes: shapesSection,
  v6: v6Section,
  signatures: signaturesSection,
  events: eventsSection,
  auth: authSection,
  latency: latencySection,
  audit: auditSection,
};
type Section = keyof typeof SECTIONS;

/** How long the service idles after start-up before its idle resident set is read. */
const IDLE_SETTLE_MS = 20_000;

/** statfs type of tmpfs: a RAM-backed temp dir takes disk writeback out of the figures. */
const TMPFS_MAGIC = 0x01021994;

interface Options {
  size: number;
  sections: Section[];
  runs: number;
  transfer: Transfer;
  store: 'local' | 's3';
  follow: boolean;
  json: boolean;
}

const USAGE = `usage: npm run bench -- [size] [--only ${Object.keys(SECTIONS).join(',')}] [--runs N] [--transfer http|fetch] [--store local|s3] [--no-follow] [--no-json]
  size        of the random test file, binary units: 256M, 1G (default), 4G
  --only      sections to run (default: all)
  --runs      repeat each section N times and keep the fastest figures (default 1)
  --transfer  how the bench uploads and downloads: node:http (default) or fetch + FormData(openAsBlob)
  --store     the service's blob store: a local folder (default) or S3 (s3rver, in its own process)
  --no-follow encrypt end to end downloads the ciphertext after the job; by default it is downloaded as it
              is produced (GET …?follow=true, from the 103 Early Hints), as the client library and the CLI do
              (fetch transfers cannot: fetch hides the 103); --follow says the default
  --no-json   omit the final JSON line`;

function parseArgs(argv: string[]): Options {
  const opts: Options = { size: GiB, sections: Object.keys(SECTIONS) as Section[], runs: 1, transfer: 'http', store: 'local', follow: true, json: true };
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i].split('=', 2) as [string, string | undefined];
    const value = () => inline ?? argv[++i] ?? fail(`${flag} needs a value`);
    if (flag === '--only') {
      const chosen = value().split(',').map(section);
      opts.sections = (Object.keys(SECTIONS) as Section[]).filter((s) => chosen.includes(s)); // always in this order
    } else if (flag === '--runs') opts.runs = positiveInt(value());
    else if (flag === '--transfer') opts.transfer = transfer(value());
    else if (flag === '--store') opts.store = store(value());
    else if (flag === '--no-follow' || flag === '--follow')
      opts.follow = flag === '--follow'; // --follow: the default, as before
    else if (flag === '--no-json') opts.json = false;
    else if (flag === '-h' || flag === '--help') fail('', 0);
    else if (!flag.startsWith('-')) opts.size = size(flag);
    else fail(`unknown option ${flag}`);
  }
  if (opts.transfer !== 'http') opts.follow = false;
  return opts;
}

function size(text: string): number {
  try {
    return parseSize(text);
  } catch (err) {
    return fail((err as Error).message);
  }
}

function section(name: string): Section {
  if (!(name in SECTIONS)) fail(`unknown section "${name}"`);
  return name as Section;
}

function transfer(name: string): Transfer {
  if (name !== 'http' && name !== 'fetch') fail(`--transfer is http or fetch, not "${name}"`);
  return name;
}

function store(name: string): Options['store'] {
  if (name !== 'local' && name !== 's3') fail(`--store is local or s3, not "${name}"`);
  return name;
}

/** s3rver in a child process (bench/lib/s3rver.mjs); resolves to the service's settings for it. */
async function startS3rver(dir: string): Promise<Record<string, string>> {
  const child = spawnTracked(process.execPath, [fileURLToPath(new URL('./lib/s3rver.mjs', import.meta.url)), join(dir, 's3rver')], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const [line] = (await once(createInterface({ input: child.stdout! }), 'line')) as [string];
  const endpoint = `http://127.0.0.1:${Number(line)}`;
  return {
    BLOB_STORE_URL: 's3://kms-bench/service',
    S3_ENDPOINT: endpoint,
    AWS_ACCESS_KEY_ID: 'S3RVER',
    AWS_SECRET_ACCESS_KEY: 'S3RVER',
    AWS_REGION: 'us-east-1',
  };
}

function positiveInt(text: string): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) fail(`not a positive integer: ${text}`);
  return n;
}

function fail(message: string, code = 2): never {
  if (message) console.error(message);
  console.error(USAGE);
  process.exit(code);
}

/** Progress lines go to stderr, so stdout is the report (and the JSON line) only. */
const say = (line: string) => console.error(`[bench] ${line}`);

async function main(): Promise<void> {
  const opts = parseArgs(process.argv.slice(2));
  const dir = await mkdtemp(join(tmpdir(), 'kms-bench-'));
  // The `auth` section sends 500 requests/s on one managed key: its per-key budget (600/min) must not answer them.
  process.env.API_KEY_RATE_LIMIT_PER_MINUTE ??= '1000000';
  const service = new Service(dir, Math.max(2 * opts.size, 8 * GiB), opts.store === 's3' ? await startS3rver(dir) : {});
  let gpg: Gpg | undefined;

  let cleaning: Promise<void> | undefined;
  let interrupted = false;
  const cleanup = () =>
    (cleaning ??= (async () => {
      say('cleaning up');
      await service.stop();
      await Promise.all([...children].map((c) => stopChild(c, 2000)));
      await gpg?.close();
      await rm(dir, { recursive: true, force: true });
    })());
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      say(`${signal}: stopping`);
      interrupted = true;
      void cleanup().finally(() => process.exit(130));
    });
  }
  const reportFailure = (err: unknown) => {
    console.error(err instanceof Error ? (err.stack ?? err.message) : err);
    console.error(`service output (last lines):\n${service.logs()}`);
  };
  // A failure nothing awaited (a request the service cut off) must not leave the service's processes running.
  for (const event of ['uncaughtException', 'unhandledRejection'] as const) {
    process.once(event, (err) => {
      reportFailure(err);
      interrupted = true;
      void cleanup().finally(() => process.exit(1));
    });
  }

  try {
    gpg = await Gpg.create(join(dir, 'gnupg'));
    const atStart = { pageCache: pageCacheWriteCost(dir), fileCreate: fileCreateCost(dir) };
    const snapshots: RssSnapshots = [];
    const bench = await prepare(opts, dir, service, gpg, snapshots);
    const results: Results = {};
    for (const name of opts.sections) {
      if (name === 'parallel') {
        say('adding a second worker process (crypto=1)');
        await service.addWorker('crypto=1');
      }
      say(`section ${name}`);
      const sampled = process.env.BENCH_PG_SAMPLE ? await samplePostgres(service.databaseUrl, `section ${name}`) : undefined;
      Object.assign(results, await SECTIONS[name](bench));
      if (sampled) for (const line of await sampled()) console.log(line);
      snapshots.push({ after: name, rss: service.rss() });
    }
    const tmpKind = `${tmpdir()} (${(await statfs(dir)).type === TMPFS_MAGIC ? 'tmpfs' : 'disk'})`;
    report(opts, results, snapshots, tmpKind, {
      pageCache: [atStart.pageCache, pageCacheWriteCost(dir)],
      fileCreate: [atStart.fileCreate, fileCreateCost(dir)],
    });
  } catch (err) {
    if (interrupted) return; // the failure is our own clean-up killing things
    reportFailure(err);
    process.exitCode = 1;
  } finally {
    await cleanup();
  }
}

/** The test file, the OpenPGP.js key, the service (API + one worker), an account and a service key. */
async function prepare(opts: Options, dir: string, service: Service, gpg: Gpg, snapshots: RssSnapshots): Promise<Bench> {
  say(`writing ${formatSize(opts.size)} of random data to ${dir}`);
  const input = join(dir, 'plain.bin');
  const inputSha = await writeRandomFile(input, opts.size);
  const pgp = await makePgpKeys();

  say('starting the service (API + 1 worker)');
  await service.startWeb();
  await service.addWorker('crypto=1,notify=1');
  snapshots.push({ after: 'start-up', rss: service.rss() });
  // Idle: what the processes hold once V8 has given back its start-up garbage (its memory reducer runs
  // some seconds after the last allocation), before any work.
  await sleep(IDLE_SETTLE_MS);
  snapshots.push({ after: `${IDLE_SETTLE_MS / 1000} s idle`, rss: service.rss(true), now: true });
  const api = new Api(service.baseUrl, opts.transfer);
  await api.register();
  const passphrase = `bench passphrase ${randomBytes(8).toString('hex')}`;
  const fingerprint = await api.generateKey(passphrase);
  snapshots.push({ after: 'key setup', rss: service.rss() });
  const keepCiphertexts = opts.sections.includes('decrypt');
  return {
    dir,
    size: opts.size,
    input,
    inputSha,
    runs: opts.runs,
    gpg,
    pgp,
    service,
    api,
    fingerprint,
    passphrase,
    cipher: {},
    keepCiphertexts,
    follow: opts.follow,
  };
}

/** What the machine charged at the start and the end of the run: page-cache writes, file creates (lib/util.ts). */
interface Probes {
  pageCache: [number, number];
  fileCreate: [number, number];
}

/** The table and ratios, then one JSON line for machine comparison. */
function report(opts: Options, results: Results, snapshots: RssSnapshots, tmpKind: string, probes: Probes): void {
  const rss = snapshots.at(-1)!.rss;
  const nproc = availableParallelism();
  const q = ratios(results, rss, nproc);
  const machine = {
    size: formatSize(opts.size),
    nproc,
    node: process.version,
    gpg: gpgVersion(),
    runs: opts.runs,
    transfer: opts.transfer,
    store: opts.store,
    follow: opts.follow,
    tmp: tmpKind,
    page_cache_s_per_gib: probes.pageCache.map((s) => Math.round(s * 100) / 100),
    file_create_us: probes.fileCreate.map(Math.round),
  };
  printReport(machine, results, snapshots, q);
  if (opts.json)
    console.log(
      JSON.stringify({
        bench: 'kms',
        ...machine,
        bytes: opts.size,
        mib_per_s: mibRates(results),
        cpu_s_per_gib: cpuPerGiBOf(results),
        ratios: q,
        peak_rss_mib: rss,
        idle_rss_mib: snapshots.find((s) => s.now)?.rss,
      }),
    );
}

function mibRates(r: Results): Record<string, number> {
  return Object.fromEntries(
    Object.entries(r)
      .filter(([k]) => !k.startsWith('rotation.'))
      .map(([k, t]) => [k, Math.round(mibPerSec(t.bytes, t.ms) * 10) / 10]),
  );
}

await main();
