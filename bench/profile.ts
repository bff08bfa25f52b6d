/**
 * Summarises V8 CPU profiles (`.cpuprofile`, as written by `node --cpu-prof`; the bench's service
 * processes write them with BENCH_CPU_PROF=<dir>): self time by function and by file, and total
 * (inclusive) time by function, each as seconds and share of the profile. Not a test.
 *
 *   tsx bench/profile.ts <dir or .cpuprofile>... [--top N]
 */
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { basename, join } from 'node:path';

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

const REPO = new URL('../', import.meta.url).href;

function where(frame: CallFrame): string {
  const url = frame.url
    .replace(REPO, '')
    .replace(/^file:\/\//, '')
    .replace(/.*node_modules\//, 'nm:');
  return url || '(native)';
}

const label = (frame: CallFrame) => `${frame.functionName || '(anonymous)'} ${where(frame)}${frame.url ? `:${frame.lineNumber + 1}` : ''}`;

function summarise(file: string, top: number): void {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as Profile;
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const selfUs = new Map<number, number>();
  let totalUs = 0;
  profile.samples.forEach((id, i) => {
    const dt = profile.timeDeltas[i] ?? 0;
    selfUs.set(id, (selfUs.get(id) ?? 0) + dt);
    totalUs += dt;
  });
  const selfFn = new Map<string, number>();
  const selfFile = new Map<string, number>();
  const inclusive = new Map<string, number>();
  for (const [id, us] of selfUs) {
    const frame = byId.get(id)!.callFrame;
    selfFn.set(label(frame), (selfFn.get(label(frame)) ?? 0) + us);
    selfFile.set(where(frame), (selfFile.get(where(frame)) ?? 0) + us);
    // Each function once per stack (recursion counted once).
    const seen = new Set<string>();
    for (let n: number | undefined = id; n !== undefined; n = parent.get(n)) {
      const l = label(byId.get(n)!.callFrame);
      if (seen.has(l)) continue;
      seen.add(l);
      inclusive.set(l, (inclusive.get(l) ?? 0) + us);
    }
  }
  const idle = [...selfFn].filter(([k]) => k.startsWith('(idle)')).reduce((a, [, v]) => a + v, 0);
  const busy = totalUs - idle;
  const show = (title: string, m: Map<string, number>) => {
    console.log(`  ${title}`);
    for (const [k, us] of [...m]
      .filter(([k]) => !k.startsWith('(idle)') && !k.startsWith('(root)'))
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)) {
      console.log(`    ${(us / 1e6).toFixed(2).padStart(7)} s ${((100 * us) / busy).toFixed(1).padStart(5)} %  ${k}`);
    }
  };
  console.log(`${basename(file)}: ${(busy / 1e6).toFixed(2)} s busy of ${(totalUs / 1e6).toFixed(2)} s sampled`);
  show('self time by file', selfFile);
  show('self time by function', selfFn);
  show('total time by function', inclusive);
}

const args = process.argv.slice(2);
const topAt = args.indexOf('--top');
const top = topAt >= 0 ? Number(args.splice(topAt, 2)[1]) : 25;
if (!args.length) {
  console.error('usage: tsx bench/profile.ts <dir or .cpuprofile>... [--top N]');
  process.exit(2);
}
for (const arg of args) {
  const files = statSync(arg).isDirectory()
    ? readdirSync(arg)
        .filter((f) => f.endsWith('.cpuprofile'))
        .map((f) => join(arg, f))
    : [arg];
  for (const f of files.sort()) summarise(f, top);
}
