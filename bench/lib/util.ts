import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, createReadStream, mkdirSync, openSync, readdirSync, readFileSync, rmSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { open } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import type { Timing } from './sections';

export const MiB = 1 << 20;

/** A positive whole-number option of a bench script's command line (`--name N`), or `def`. */
export function intOption(args: string[], name: string, def: number): number {
  const at = args.indexOf(name);
  const n = at >= 0 ? Number(args[at + 1]) : def;
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} needs a positive integer`);
  return n;
}

export const GiB = 1 << 30;

/** `1G`, `256M`, `512K`, `1.5G` or plain bytes; binary units (G = GiB). */
export function parseSize(text: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?$/i.exec(text.trim());
  if (!m) throw new Error(`bad size "${text}" (try 1G, 256M)`);
  const unit = { '': 1, K: 1 << 10, M: MiB, G: GiB, T: GiB * 1024 }[m[2].toUpperCase() as '' | 'K' | 'M' | 'G' | 'T'];
  const bytes = Math.round(Number(m[1]) * unit);
  if (bytes < 1) throw new Error(`size must be at least 1 byte: "${text}"`);
  return bytes;
}

export function formatSize(bytes: number): string {
  if (bytes >= GiB) return `${+(bytes / GiB).toFixed(2)} GiB`;
  if (bytes >= MiB) return `${+(bytes / MiB).toFixed(1)} MiB`;
  return `${bytes} B`;
}

/** Throughput in MiB/s. */
export const mibPerSec = (bytes: number, ms: number) => bytes / MiB / (ms / 1000);

/** How the bench marks a figure against one of its targets (docs/performance.md): `(≤ 50 ms: ok)`, `(≥ 1: MISSED)`. */
export const verdict = (value: number, op: '≥' | '≤', goal: number, unit = '') =>
  `(${op} ${goal}${unit}: ${(op === '≥' ? value >= goal : value <= goal) ? 'ok' : 'MISSED'})`;

/**
 * What writing into the page cache costs the host's kernel right now: system CPU seconds per GiB to
 * write `bytes` of zeros to a new file in `dir` (then deleted). A virtual machine may hand memory the guest
 * frees back to the host within seconds (virtio-balloon free page reporting), and the host backs a page
 * again only when it is next written, at about ten times the cost of pages freed a moment ago. Every
 * process that writes a new file or grows its heap pays it (gpg's output, the service's blobs, the download),
 * so the bench prints it beside the figures it inflates (bench/README.md, "Memory the host takes back").
 */
export function pageCacheWriteCost(dir: string, bytes = 256 * MiB): number {
  const path = join(dir, `page-cache-probe-${randomId()}`);
  const chunk = Buffer.alloc(MiB);
  const fd = openSync(path, 'wx');
  const before = process.cpuUsage().system;
  try {
    for (let left = bytes; left > 0; left -= MiB) writeSync(fd, chunk);
    return (process.cpuUsage().system - before) / 1e6 / (bytes / GiB);
  } finally {
    closeSync(fd);
    rmSync(path, { force: true });
  }
}

/**
 * What creating a file costs the host's filesystem right now, in µs of wall time (`files` empty files
 * in a new folder of `dir`, then removed). Without a journal, ext4 scans past every inode freed in the
 * last minutes before it hands one out, so a create costs far more after a stream of small jobs than on
 * a quiet disk (docs/performance.md). Each job creates a handful of files
 * (markers, segments, its data key), so the small-job figures move with this one (bench/README.md, "Files
 * the filesystem hands out").
 */
export function fileCreateCost(dir: string, files = 200): number {
  const folder = join(dir, `create-probe-${randomId()}`);
  mkdirSync(folder);
  try {
    const start = performance.now();
    for (let i = 0; i < files; i++) closeSync(openSync(join(folder, String(i)), 'wx'));
    return ((performance.now() - start) * 1000) / files;
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
}

/** Writes `bytes` of crypto.randomBytes in 1 MiB chunks; returns the sha256 (hex) of what was written. */
export async function writeRandomFile(path: string, bytes: number): Promise<string> {
  const hash = createHash('sha256');
  const file = await open(path, 'wx');
  try {
    for (let left = bytes; left > 0; left -= MiB) {
      const chunk = randomBytes(Math.min(MiB, left));
      hash.update(chunk);
      await file.write(chunk);
    }
  } finally {
    await file.close();
  }
  return hash.digest('hex');
}

export async function sha256File(path: string): Promise<string> {
  const hash = createHash('sha256');
  await pipeline(createReadStream(path, { highWaterMark: MiB }), hash);
  return hash.digest('hex');
}

// ------------------------------------------------------------------------------- child processes

/** Every child we start, so clean-up can end exactly those (by pid), also on SIGINT. */
export const children = new Set<ChildProcess>();

export function spawnTracked(cmd: string, args: string[], opts: SpawnOptions): ChildProcess {
  const child = spawn(cmd, args, opts);
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

/** Runs a command to completion; rejects with its stderr on a non-zero exit. */
export function run(cmd: string, args: string[], opts: SpawnOptions = {}): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawnTracked(cmd, args, { ...opts, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
    child.once('error', reject);
    child.once('exit', (code, signal) => {
      if (code === 0) resolve();
      else reject(new Error(`${cmd} ${args.join(' ')} exited with ${code ?? signal}:\n${stderr.trim()}`));
    });
  });
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves once the child has exited. */
export async function stopChild(child: ChildProcess, graceMs = 10_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(timer);
}

// ------------------------------------------------------------------------------- /proc figures

/** Resident set of a live process in MiB, its peak (VmHWM) or now (VmRSS); null once it is gone. */
export function rssMiB(pid: number, which: 'VmHWM' | 'VmRSS' = 'VmHWM'): number | null {
  try {
    const m = new RegExp(`^${which}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : null;
  } catch {
    return null;
  }
}

/** User + system CPU seconds of a process (all its threads) so far. */
export function cpuSeconds(pid: number): number {
  try {
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15 overall.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return NaN;
  }
}
/**
 * CPU seconds of the Postgres backends connected to `database` (their process title names it), as a counter
 * that only grows: each reading adds what every backend used since the one before, and a backend that started
 * meanwhile counts whole. None of the host's other sessions or Postgres's own processes (checkpointer, WAL
 * writer) count; a backend that ends between two readings takes its last stretch with it.
 */
export function backendCpuCounter(database: string): () => number {
  let seen: Map<number, number> | undefined;
  let total = 0;
  return () => {
    const now = new Map<number, number>();
    for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
      try {
        const title = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
        if (!title.startsWith('postgres: ') || !title.split(' ').includes(database)) continue;
        const s = cpuSeconds(Number(pid));
        if (Number.isFinite(s)) now.set(Number(pid), s);
      } catch {
        // gone meanwhile
      }
    }
    if (seen) for (const [pid, s] of now) total += s - (seen.get(pid) ?? 0);
    seen = now;
    return total;
  };
}

/** CPU seconds of the service's processes, of its Postgres backends and of this bench process (for CPU per request). */
export const serviceCpuReader = (service: { cpu(): Record<string, number>; database: string }) => {
  const postgres = backendCpuCounter(service.database);
  return () => ({ ...service.cpu(), postgres: postgres(), bench: ownCpuSeconds().self });
};

/** CPU seconds of this process, and of its children that have exited and been reaped (gpg runs). */
export function ownCpuSeconds(): { self: number; children: number } {
  const { user, system } = process.cpuUsage();
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // cutime and cstime are fields 16 and 17 overall.
  return { self: (user + system) / 1e6, children: (Number(fields[13]) + Number(fields[14])) / CLOCK_TICKS };
}

/** USER_HZ: 100 on every Linux build that matters here (`getconf CLK_TCK`). */
const CLOCK_TICKS = 100;

export const randomId = (bytes = 4) => randomBytes(bytes).toString('hex');

/** Times in-process work with this process's CPU split into user and system, after writing dirty pages out. */
export async function timedInProcess(bytes: number, work: () => Promise<void>): Promise<Timing> {
  await run('sync', []);
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await work();
  const ms = performance.now() - t0;
  const c = process.cpuUsage(c0);
  return { bytes, ms, cpu: { user: c.user / 1e6, sys: c.system / 1e6 } };
}
