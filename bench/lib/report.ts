import { ROTATION_KEYS, type Results, type Timing } from './sections';
import { SEALING_LABELS, sealingSummary } from './sealing';
import { GiB, mibPerSec, verdict } from './util';

export interface Machine {
  size: string;
  nproc: number;
  node: string;
  gpg: string;
  runs: number;
  transfer: string;
  tmp: string;
  /** System CPU seconds per GiB written into the page cache, probed at the start and the end of the run (util.ts pageCacheWriteCost). */
  page_cache_s_per_gib: number[];
  /** µs to create a file, probed likewise (util.ts fileCreateCost). */
  file_create_us: number[];
}

/** Peak RSS (MiB) per service process, as read after each section. */
/** Peak resident sets after each step; `now`: the resident set at that moment instead (idle). */
export type RssSnapshots = { after: string; rss: Record<string, number | null>; now?: boolean }[];

const LABELS: Record<string, string> = {
  'encrypt.gpg': 'gpg',
  'encrypt.openpgp': 'OpenPGP.js in-process',
  'encrypt.service': 'service end to end',
  'encrypt.job': 'service job only',
  'decrypt.gpg': 'gpg',
  'decrypt.openpgp': 'OpenPGP.js in-process',
  'decrypt.service': 'service end to end',
  'decrypt.job': 'service job only',
  'parallel.gpg': '2 × gpg at once (aggregate)',
  'parallel.jobs': '2 jobs, 2 workers (aggregate)',
  'parallel.service': '2 jobs end to end (aggregate)',
  ...SEALING_LABELS,
};

const rate = (t: Timing | undefined) => (t ? mibPerSec(t.bytes, t.ms) : undefined);
const ratio = (a: Timing | undefined, b: Timing | undefined) => (a && b ? rate(a)! / rate(b)! : undefined);
const fixed = (x: number | undefined, digits = 2) => (x === undefined || Number.isNaN(x) ? '–' : x.toFixed(digits));

export interface Ratios {
  encrypt_e2e_vs_openpgp?: number;
  decrypt_e2e_vs_openpgp?: number;
  parallel_jobs_vs_gpg?: number;
  encrypt_job_vs_openpgp?: number;
  decrypt_job_vs_openpgp?: number;
  parallel_e2e_vs_gpg?: number;
  openpgp_vs_gpg_encrypt?: number;
  peak_rss_api_mib?: number;
  peak_rss_worker_mib?: number;
  rotations_per_s_1_worker?: number;
  rotations_per_s_2_workers?: number;
  rotation_2_vs_1_workers?: number;
  /** The first batch on fresh processes (before V8 has compiled the hot path). */
  rotations_per_s_1_worker_cold?: number;
  rotations_per_s_2_workers_cold?: number;
  /** The worker's CPU per GiB over a whole job (upload, job, download) ÷ gpg's for the same file. */
  worker_cpu_vs_gpg_encrypt?: number;
  worker_cpu_vs_gpg_decrypt?: number;
  /** The API's CPU seconds per GiB while it receives the upload and while it serves the download. */
  api_cpu_s_per_gib_receiving_encrypt?: number;
  api_cpu_s_per_gib_serving_encrypt?: number;
  /** The same when the download was followed: both at once, so only their sum is known. */
  api_cpu_s_per_gib_receiving_and_serving_encrypt?: number;
  api_cpu_s_per_gib_receiving_decrypt?: number;
  api_cpu_s_per_gib_serving_decrypt?: number;
  /**
   * The most each ratio could be on the host that ran it, at the CPU the run measured: the service's rate if its CPU per
   * GiB (or per rotation), summed over all its processes and the bench client, kept every core busy.
   */
  ceiling_encrypt_e2e_vs_openpgp?: number;
  ceiling_decrypt_e2e_vs_openpgp?: number;
  ceiling_parallel_jobs_vs_gpg?: number;
  ceiling_rotation_2_vs_1_workers?: number;
  /**
   * The same ratios with a core for each service process (an estimate of what more cores would give): each step
   * lasts at least its busiest process's CPU time, and the steps follow one another.
   */
  core_each_encrypt_e2e_vs_openpgp?: Projection;
  core_each_decrypt_e2e_vs_openpgp?: Projection;
  core_each_parallel_jobs_vs_gpg?: Projection;
  core_each_rotation_2_vs_1_workers?: Projection;
  /** `shapes`: SEIPDv2 decryption (as the service writes it) ÷ SEIPDv1's, in this process. */
  shapes_v2_ocb_vs_v1_decrypt?: number;
  shapes_v2_gcm_vs_v1_decrypt?: number;
  /** `v6`: a v6 file's round trip through the service ÷ the scripted one; its worker CPU per GiB ÷ gpg's. */
  v6_roundtrip_vs_scripted?: number;
  v6_worker_cpu_vs_gpg?: number;
}

/**
 * A projected ratio for the service's processes (the client on a machine of its own), the same with a core
 * for the bench client too, the service process that bounds each step, and how many cores it assumes.
 */
interface Projection {
  ratio: number;
  with_client: number;
  busiest: string[];
  processes: number;
}

/** Rotation figures count rotations, not bytes: `bytes` holds the number of rotations. */
const isRotation = (key: string) => key.startsWith('rotation.');
const perSecond = (t: Timing | undefined) => (t ? t.bytes / (t.ms / 1000) : undefined);

/** CPU seconds per GiB of the processes `who` picks, in one step of a timing (all steps without `step`). */
function cpuPerGiBIn(t: Timing | undefined, who: (process: string) => boolean, step?: string): number | undefined {
  const phases = t?.phaseCpu && (step ? [t.phaseCpu[step] ?? {}] : Object.values(t.phaseCpu));
  if (!t || !phases) return undefined;
  return phases.reduce((n, cpu) => n + Object.entries(cpu).reduce((m, [k, v]) => m + (who(k) ? v : 0), 0), 0) / (t.bytes / GiB);
}
const isWorker = (process: string) => process.startsWith('worker');
const isApi = (process: string) => process === 'api';
const workerVsGpg = (service: Timing | undefined, gpg: Timing | undefined) => {
  const worker = cpuPerGiBIn(service, isWorker);
  const base = gpg?.cpu?.gpg;
  return worker !== undefined && base ? worker / (base / (gpg.bytes / GiB)) : undefined;
};

/**
 * The rate (bytes or rotations per second) a run could reach on `cores` cores at the CPU it measured per unit,
 * all its processes together (by default its whole span; `steps`: only those).
 */
function cpuBound(t: Timing | undefined, cores: number, steps?: string[]): number | undefined {
  const spans = t && (steps ? steps.map((k) => t.phaseCpu?.[k] ?? {}) : [t.cpu ?? {}]);
  const seconds = spans?.reduce((n, cpu) => n + Object.values(cpu).reduce((m, v) => m + v, 0), 0);
  return t && seconds ? (cores * t.bytes) / seconds : undefined;
}
const over = (a: number | undefined, b: number | undefined) => (a !== undefined && b ? a / b : undefined);

/**
 * The rate a run could reach with a core of its own for each of the processes `who` picks: each step (`steps`,
 * or every step it has) lasts at least the CPU time of its busiest process. A process's threads count as one,
 * so this leans low; the CPU is the one measured in this run, where more processes than cores inflate it.
 */
function coreEachBound(t: Timing | undefined, who: (process: string) => boolean, steps?: string[]) {
  const spans = t && (steps ? steps.map((k) => t.phaseCpu?.[k] ?? {}) : t.phaseCpu ? Object.values(t.phaseCpu) : [t.cpu ?? {}]);
  const busiest = spans?.map((cpu) =>
    Object.entries(cpu)
      .filter(([k]) => who(k))
      .reduce<[string, number]>((m, e) => (e[1] > m[1] ? e : m), ['', 0]),
  );
  const seconds = busiest?.reduce((n, [, s]) => n + s, 0);
  if (!t || !spans || !busiest || !seconds) return undefined;
  return {
    rate: t.bytes / seconds,
    busiest: busiest.filter(([, s]) => s > 0).map(([k]) => k),
    processes: new Set(spans.flatMap((cpu) => Object.keys(cpu).filter(who))).size,
  };
}
// Postgres's backends are summed into one figure but run on as many cores as there are connections: left out.
const isService = (process: string) => process !== 'bench' && process !== 'postgres';
const orClient = (process: string) => process !== 'postgres';

/** A ratio with a core for each service process, and the same with one more for the bench client. */
function projection(t: Timing | undefined, base: (who: (process: string) => boolean) => number | undefined, steps?: string[]): Projection | undefined {
  const [service, client] = [coreEachBound(t, isService, steps), coreEachBound(t, orClient, steps)];
  const [b1, b2] = [base(isService), base(orClient)];
  return service && client && b1 && b2
    ? { ratio: service.rate / b1, with_client: client.rate / b2, busiest: service.busiest, processes: service.processes }
    : undefined;
}

export function ratios(r: Results, rss: Record<string, number | null>, cores: number): Ratios {
  return { ...serviceRatios(r, rss, cores), ...shapesRatios(r), ...v6Ratios(r) };
}

function serviceRatios(r: Results, rss: Record<string, number | null>, cores: number): Ratios {
  const workers = Object.entries(rss)
    .filter(([k, v]) => isWorker(k) && v !== null)
    .map(([, v]) => v!);
  return {
    encrypt_e2e_vs_openpgp: ratio(r['encrypt.service'], r['encrypt.openpgp']),
    decrypt_e2e_vs_openpgp: ratio(r['decrypt.service'], r['decrypt.openpgp']),
    parallel_jobs_vs_gpg: ratio(r['parallel.jobs'], r['parallel.gpg']),
    encrypt_job_vs_openpgp: ratio(r['encrypt.job'], r['encrypt.openpgp']),
    decrypt_job_vs_openpgp: ratio(r['decrypt.job'], r['decrypt.openpgp']),
    parallel_e2e_vs_gpg: ratio(r['parallel.service'], r['parallel.gpg']),
    openpgp_vs_gpg_encrypt: ratio(r['encrypt.openpgp'], r['encrypt.gpg']),
    peak_rss_api_mib: rss.api ?? undefined,
    peak_rss_worker_mib: workers.length ? Math.max(...workers) : undefined,
    rotations_per_s_1_worker: perSecond(r['rotation.1w']),
    rotations_per_s_2_workers: perSecond(r['rotation.2w']),
    rotation_2_vs_1_workers: r['rotation.1w'] && r['rotation.2w'] ? perSecond(r['rotation.2w'])! / perSecond(r['rotation.1w'])! : undefined,
    rotations_per_s_1_worker_cold: perSecond(r['rotation.1w.cold']),
    rotations_per_s_2_workers_cold: perSecond(r['rotation.2w.cold']),
    worker_cpu_vs_gpg_encrypt: workerVsGpg(r['encrypt.service'], r['encrypt.gpg']),
    worker_cpu_vs_gpg_decrypt: workerVsGpg(r['decrypt.service'], r['decrypt.gpg']),
    ...(r['encrypt.service']?.followed
      ? { api_cpu_s_per_gib_receiving_and_serving_encrypt: cpuPerGiBIn(r['encrypt.service'], isApi) }
      : {
          api_cpu_s_per_gib_receiving_encrypt: cpuPerGiBIn(r['encrypt.service'], isApi, 'upload'),
          api_cpu_s_per_gib_serving_encrypt: cpuPerGiBIn(r['encrypt.service'], isApi, 'download'),
        }),
    api_cpu_s_per_gib_receiving_decrypt: cpuPerGiBIn(r['decrypt.service'], isApi, 'upload'),
    api_cpu_s_per_gib_serving_decrypt: cpuPerGiBIn(r['decrypt.service'], isApi, 'download'),
    ceiling_encrypt_e2e_vs_openpgp: over(cpuBound(r['encrypt.service'], cores), perSecond(r['encrypt.openpgp'])),
    ceiling_decrypt_e2e_vs_openpgp: over(cpuBound(r['decrypt.service'], cores), perSecond(r['decrypt.openpgp'])),
    // The jobs' rate runs from the upload's start to the last job's end: the download is not in it.
    ceiling_parallel_jobs_vs_gpg: over(cpuBound(r['parallel.jobs'], cores, ['upload', 'jobs']), perSecond(r['parallel.gpg'])),
    ceiling_rotation_2_vs_1_workers: over(cpuBound(r['rotation.1w'], cores), perSecond(r['rotation.1w'])),
    // The baselines keep their measured rates: each is one process per core already.
    core_each_encrypt_e2e_vs_openpgp: projection(r['encrypt.service'], () => perSecond(r['encrypt.openpgp'])),
    core_each_decrypt_e2e_vs_openpgp: projection(r['decrypt.service'], () => perSecond(r['decrypt.openpgp'])),
    core_each_parallel_jobs_vs_gpg: projection(r['parallel.jobs'], () => perSecond(r['parallel.gpg']), ['upload', 'jobs']),
    // One worker would be faster too with cores of its own: both sides are projected.
    core_each_rotation_2_vs_1_workers: projection(r['rotation.2w'], (who) => coreEachBound(r['rotation.1w'], who)?.rate),
  };
}

/** SEIPDv2 (OCB, GCM) decryption ÷ SEIPDv1's, as the service writes both, in the same run. */
export function shapesRatios(r: Results): { shapes_v2_ocb_vs_v1_decrypt?: number; shapes_v2_gcm_vs_v1_decrypt?: number } {
  const base = r['shapes.v1'];
  const of = (key: string) => (base && r[key] ? mibPerSec(r[key].bytes, r[key].ms) / mibPerSec(base.bytes, base.ms) : undefined);
  return { shapes_v2_ocb_vs_v1_decrypt: of('shapes.v2-ocb'), shapes_v2_gcm_vs_v1_decrypt: of('shapes.v2-gcm') };
}

export const workerCpuPerGiB = (t: Timing | undefined) =>
  t ? Object.entries(t.cpu ?? {}).reduce((n, [k, v]) => n + (k.startsWith('worker') ? v : 0), 0) / (t.bytes / GiB) : undefined;
export const gpgCpuPerGiB = (t: Timing | undefined, phase?: string) => {
  const cpu = phase ? t?.phaseCpu?.[phase] : t?.cpu;
  return t && cpu?.gpg ? cpu.gpg / (t.bytes / GiB) : undefined;
};

/** The section's two ratios: round trip through the service ÷ the script, and worker CPU ÷ gpg's. */
export function v6Ratios(r: Results): { v6_roundtrip_vs_scripted?: number; v6_worker_cpu_vs_gpg?: number } {
  const [service, scripted] = [r['v6.service'], r['v6.scripted']];
  const worker = [workerCpuPerGiB(service), workerCpuPerGiB(r['v6.service-decrypt'])];
  const gpg = [gpgCpuPerGiB(scripted, 'gpg -e'), gpgCpuPerGiB(r['v6.gpg-decrypt'])];
  return {
    v6_roundtrip_vs_scripted: service && scripted ? mibPerSec(service.bytes, service.ms) / mibPerSec(scripted.bytes, scripted.ms) : undefined,
    v6_worker_cpu_vs_gpg: worker.every((x) => x !== undefined) && gpg.every((x) => x) ? (worker[0] + worker[1]) / (gpg[0]! + gpg[1]!) : undefined,
  };
}

/** The throughput ratios with a ceiling and a projection (`ceiling_<key>`, `core_each_<key>` in Ratios). */
const BOUNDED = [
  ['e2e encrypt ÷ OpenPGP.js', 'encrypt_e2e_vs_openpgp'],
  ['e2e decrypt ÷ OpenPGP.js', 'decrypt_e2e_vs_openpgp'],
  ['parallel jobs ÷ 2×gpg', 'parallel_jobs_vs_gpg'],
  ['rotations 2 ÷ 1 workers', 'rotation_2_vs_1_workers'],
] as const;

export function printReport(m: Machine, r: Results, snapshots: RssSnapshots, q: Ratios): void {
  const out: string[] = [];
  out.push(
    `KMS bench · ${m.size} random file · nproc ${m.nproc} · node ${m.node} · gpg ${m.gpg} · best of ${m.runs} run(s) · transfers via ${m.transfer} · temp ${m.tmp} · page cache writes ${m.page_cache_s_per_gib.join(' → ')} CPU-s/GiB · file creates ${m.file_create_us.join(' → ')} µs`,
  );
  out.push('');
  out.push(`${'section'.padEnd(9)} ${'what'.padEnd(31)} ${'MiB/s'.padStart(7)} ${'seconds'.padStart(8)}   where the time went (s) [CPU s per process]`);
  for (const [key, t] of Object.entries(r)) {
    if (isRotation(key)) continue;
    const [section] = key.split('.');
    out.push(`${section.padEnd(9)} ${(LABELS[key] ?? key).padEnd(31)} ${fixed(rate(t), 1).padStart(7)} ${fixed(t.ms / 1000).padStart(8)}   ${details(t)}`);
  }
  out.push('');
  for (const s of snapshots) {
    const sizes = Object.entries(s.rss)
      .map(([k, v]) => `${k} ${fixed(v ?? undefined, 0)} MiB`)
      .join(' · ');
    out.push(
      s.now
        ? `RSS (VmRSS) after ${s.after.padEnd(15)} ${sizes} (≤ 120 each: ${Object.values(s.rss).every((v) => v !== null && v <= 120) ? 'ok' : 'MISSED'})`
        : `peak RSS (VmHWM) after ${s.after.padEnd(10)} ${sizes}`,
    );
  }
  out.push('');
  // The service's targets (docs/performance.md).
  out.push(
    [
      target('e2e encrypt ÷ OpenPGP.js', q.encrypt_e2e_vs_openpgp, '≥', 1.0),
      target('e2e decrypt ÷ OpenPGP.js', q.decrypt_e2e_vs_openpgp, '≥', 1.0),
      target('parallel jobs ÷ 2×gpg', q.parallel_jobs_vs_gpg, '≥', 0.6),
      target('peak RSS api MiB', q.peak_rss_api_mib, '≤', 200, 0),
      target('worker MiB', q.peak_rss_worker_mib, '≤', 200, 0),
    ].join(' | '),
  );
  out.push(
    [
      target('worker CPU ÷ gpg: encrypt', q.worker_cpu_vs_gpg_encrypt, '≤', 1.5),
      target('decrypt', q.worker_cpu_vs_gpg_decrypt, '≤', 2),
      q.api_cpu_s_per_gib_receiving_and_serving_encrypt === undefined
        ? `API CPU-s/GiB receiving / serving: ${target('during encryption', q.api_cpu_s_per_gib_receiving_encrypt, '≤', 1.5)} / ${target('', q.api_cpu_s_per_gib_serving_encrypt, '≤', 1.0).trim()}`
        : `API CPU-s/GiB receiving + serving at once (followed): ${target('during encryption', q.api_cpu_s_per_gib_receiving_and_serving_encrypt, '≤', 2.5)}`,
      `${target('during decryption', q.api_cpu_s_per_gib_receiving_decrypt, '≤', 1.5)} / ${target('', q.api_cpu_s_per_gib_serving_decrypt, '≤', 1.0).trim()}`,
    ].join(' | '),
  );
  if (q.rotations_per_s_1_worker !== undefined) {
    out.push(
      `rotation (${ROTATION_KEYS} keys at once, through the queue, after a warm-up): ${target('1 worker, per second', q.rotations_per_s_1_worker, '≥', 100, 1)} · 2 workers ${fixed(q.rotations_per_s_2_workers, 1)}/s · ${target('2 ÷ 1 workers', q.rotation_2_vs_1_workers, '≥', 1.6)} · first batch on fresh processes: 1 worker ${fixed(q.rotations_per_s_1_worker_cold, 1)}/s, 2 workers ${fixed(q.rotations_per_s_2_workers_cold, 1)}/s`,
    );
    for (const w of ['1w', '2w']) {
      const t = r[`rotation.${w}`];
      if (t?.cpu)
        out.push(
          `  CPU ms per rotation, ${w.replace('w', ' worker(s)')}: ${Object.entries(t.cpu)
            .map(([k, s]) => `${k} ${fixed((s * 1000) / t.bytes, 1)}`)
            .join(' · ')}${
            t.work
              ? `; per rotation: ${Object.entries(t.work)
                  .map(([k, n]) => `${k.replace(/_/g, ' ')} ${fixed(n / t.bytes, 1)}`)
                  .join(' · ')}`
              : ''
          }`,
        );
    }
  }
  const ceilings = BOUNDED.flatMap(([label, k]) => (q[`ceiling_${k}`] === undefined ? [] : [[label, q[`ceiling_${k}`]!] as const]));
  if (ceilings.length)
    out.push(
      `at most, at this CPU per GiB or rotation (all processes, the bench's too, on ${m.nproc} busy cores): ${ceilings.map(([k, v]) => `${k} ${fixed(v)}`).join(' · ')}`,
    );
  const projections = BOUNDED.flatMap(([label, k]) => (q[`core_each_${k}`] === undefined ? [] : [[label, q[`core_each_${k}`]!] as const]));
  if (projections.length) {
    out.push(
      `with a core for each service process, at this CPU (each step as long as its busiest process [which, step by step]; with one more for the bench client): ${projections.map(([k, p]) => `${k} ${fixed(p.ratio)} on ${p.processes} cores [${p.busiest.join(', ')}] (${fixed(p.with_client)})`).join(' · ')}`,
    );
  }
  for (const line of sealingSummary(r)) out.push(line);
  out.push(`CPU seconds per GiB (service: its processes, not the bench client): ${cpuPerGiB(r)}`);
  out.push(
    `also: job-only encrypt ÷ OpenPGP.js ${fixed(q.encrypt_job_vs_openpgp)} · job-only decrypt ÷ OpenPGP.js ${fixed(q.decrypt_job_vs_openpgp)} · parallel e2e ÷ 2×gpg ${fixed(q.parallel_e2e_vs_gpg)} · OpenPGP.js ÷ gpg encrypt ${fixed(q.openpgp_vs_gpg_encrypt)}`,
  );
  if (q.shapes_v2_ocb_vs_v1_decrypt !== undefined || q.v6_roundtrip_vs_scripted !== undefined)
    out.push(
      [
        target('SEIPDv2 ÷ SEIPDv1 decrypt: OCB', q.shapes_v2_ocb_vs_v1_decrypt, '≥', 1.5),
        target('GCM', q.shapes_v2_gcm_vs_v1_decrypt, '≥', 1.5),
        target('v6 round trip ÷ scripted (PUT, gpg -e, GET)', q.v6_roundtrip_vs_scripted, '≥', 1.5),
        `v6 worker CPU ÷ gpg (encrypt + decrypt) ${fixed(q.v6_worker_cpu_vs_gpg)}`,
      ].join(' | '),
    );
  console.log(out.join('\n'));
}

/** CPU cost per GiB of each figure that has CPU readings. */
export function cpuPerGiBOf(r: Results): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [key, t] of Object.entries(r)) {
    if (!t.cpu || isRotation(key)) continue;
    const own = Object.entries(t.cpu).filter(([k]) => k !== 'bench');
    const seconds = (own.length ? own : Object.entries(t.cpu)).reduce((n, [, v]) => n + v, 0);
    out[key] = Math.round((seconds / (t.bytes / GiB)) * 100) / 100;
  }
  return out;
}

function cpuPerGiB(r: Results): string {
  return Object.entries(cpuPerGiBOf(r))
    .map(([k, v]) => `${k} ${fixed(v, 1)}`)
    .join(' · ');
}

/** `upload 0.80 [api 0.4 bench 0.3] · queue 0.01 · job 1.41 [worker-1 1.4] …`, or the CPU of a baseline. */
function details(t: Timing): string {
  const cpu = (c: Record<string, number> | undefined) =>
    c && Object.keys(c).length
      ? ` [${Object.entries(c)
          .map(([k, s]) => `${k} ${fixed(s, 1)}`)
          .join(' ')}]`
      : '';
  if (!t.parts) return t.cpu ? `cpu${cpu(t.cpu)}` : '';
  return Object.entries(t.parts)
    .map(([k, ms]) => `${k} ${fixed(ms / 1000)}${cpu(t.phaseCpu?.[k])}`)
    .join(' · ');
}

function target(name: string, value: number | undefined, op: '≥' | '≤', goal: number, digits = 2): string {
  return value === undefined ? `${name} –` : `${name} ${fixed(value, digits)} ${verdict(value, op, goal)}`;
}
