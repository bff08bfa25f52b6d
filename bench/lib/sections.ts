import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { pgpDecrypt, pgpEncrypt, type Gpg, type PgpKeys } from './baselines';
import type { Api, JobView } from './client';
import type { Service } from './service';
import { ownCpuSeconds, sha256File } from './util';

/** What every section works with. Ciphertexts are kept for the decrypt section. */
export interface Bench {
  dir: string;
  size: number;
  input: string;
  inputSha: string;
  runs: number;
  gpg: Gpg;
  pgp: PgpKeys;
  service: Service;
  api: Api;
  fingerprint: string;
  passphrase: string;
  cipher: { gpg?: string; pgp?: string; service?: string };
}

/** One timed thing: `bytes` in `ms`, plus an optional break-down of where the time went. */
export interface Timing {
  bytes: number;
  ms: number;
  parts?: Record<string, number>;
  cpu?: Record<string, number>;
}

export type Results = Record<string, Timing>;

const path = (b: Bench, name: string) => join(b.dir, name);

/** Runs `measure` b.runs times and keeps, per figure, the fastest (least disturbed) run. */
async function bestOf(b: Bench, measure: () => Promise<Results>): Promise<Results> {
  const best: Results = {};
  for (let i = 0; i < b.runs; i++) {
    for (const [k, t] of Object.entries(await measure())) if (!best[k] || t.ms < best[k].ms) best[k] = t;
  }
  return best;
}

// ------------------------------------------------------------------------------------- sections

export function encryptSection(b: Bench): Promise<Results> {
  const [gpgOut, pgpOut, svcOut] = [path(b, 'gpg.gpg'), path(b, 'pgp.gpg'), path(b, 'service.gpg')];
  return bestOf(b, async () => {
    const gpg = await baseline(b.size, () => b.gpg.encrypt(b.input, gpgOut));
    const pgp = await baseline(b.size, () => pgpEncrypt(b.input, pgpOut, b.pgp));
    const service = await serviceRun(b, () => b.api.submitEncrypt(b.input, b.fingerprint), svcOut);
    Object.assign(b.cipher, { gpg: gpgOut, pgp: pgpOut, service: svcOut });
    return { 'encrypt.gpg': gpg, 'encrypt.openpgp': pgp, ...serviceFigures('encrypt', service) };
  });
}

export async function decryptSection(b: Bench): Promise<Results> {
  const cipher = await ciphertexts(b);
  const [gpgOut, pgpOut, svcOut] = [path(b, 'gpg.out'), path(b, 'pgp.out'), path(b, 'service.out')];
  return bestOf(b, async () => {
    const gpg = await baseline(b.size, () => b.gpg.decrypt(cipher.gpg, gpgOut));
    await checkPlaintext(b, gpgOut, 'gpg decrypt');
    const pgp = await baseline(b.size, () => pgpDecrypt(cipher.pgp, pgpOut, b.pgp));
    await checkPlaintext(b, pgpOut, 'OpenPGP.js decrypt');
    const service = await serviceRun(b, () => b.api.submitDecrypt(cipher.service, b.fingerprint, b.passphrase), svcOut);
    await checkPlaintext(b, svcOut, 'service decrypt download');
    // Throughput counts plaintext bytes on both sides, like the encrypt figures.
    return { 'decrypt.gpg': gpg, 'decrypt.openpgp': pgp, ...serviceFigures('decrypt', { ...service, bytes: b.size }) };
  });
}

/** The same file twice at once: two gpg processes, then two encrypt jobs on two worker processes. */
export function parallelSection(b: Bench): Promise<Results> {
  const outs = [path(b, 'par-gpg-1.gpg'), path(b, 'par-gpg-2.gpg')];
  const svcOuts = [path(b, 'par-service-1.gpg'), path(b, 'par-service-2.gpg')];
  return bestOf(b, async () => {
    const gpg = await baseline(2 * b.size, () => Promise.all(outs.map((out) => b.gpg.encrypt(b.input, out))));
    await Promise.all(outs.map((f) => rm(f)));
    const service = await parallelServiceRun(b, svcOuts);
    await Promise.all(svcOuts.map((f) => rm(f)));
    return { 'parallel.gpg': gpg, ...service };
  });
}

// -------------------------------------------------------------------------------------- service

interface ServiceRun {
  bytes: number;
  /** Bench clock (ms since epoch): submit start, 202 received, completion seen, download end. */
  t0: number;
  t1: number;
  t2: number;
  t3: number;
  job: JobView;
  cpu: Record<string, number>;
}

/** upload → 202 → poll until completed → download to `dest`, with each step's time. */
async function serviceRun(b: Bench, submit: () => Promise<JobView>, dest: string): Promise<ServiceRun> {
  const cpu0 = cpuNow(b);
  const t0 = Date.now();
  const { job_id } = await submit();
  const t1 = Date.now();
  const job = await waitFor(b, job_id);
  const t2 = Date.now();
  const bytes = await b.api.download(job.result!.files![0]!.download_url, dest);
  const t3 = Date.now();
  await dropJobFiles(b, job_id);
  return { bytes, t0, t1, t2, t3, job, cpu: cpuSince(b, cpu0) };
}

/** Generous: 2 minutes plus 2 minutes per GiB (about 8 MiB/s), in case a job never ends. */
const waitFor = (b: Bench, jobId: string) => b.api.waitForJob(jobId, 120_000 * (1 + b.size / 2 ** 30), () => b.service.assertRunning());

/** e2e (upload start → download end) and job-only (the job's started_at → finished_at) figures. */
function serviceFigures(kind: string, r: ServiceRun): Results {
  const started = Date.parse(r.job.started_at!);
  const finished = Date.parse(r.job.finished_at!);
  const parts = { upload: r.t1 - r.t0, queue: started - r.t1, job: finished - started, poll: r.t2 - finished, download: r.t3 - r.t2 };
  return {
    [`${kind}.service`]: { bytes: r.bytes, ms: r.t3 - r.t0, parts, cpu: r.cpu },
    [`${kind}.job`]: { bytes: r.bytes, ms: finished - started },
  };
}

async function parallelServiceRun(b: Bench, dests: string[]): Promise<Results> {
  const cpu0 = cpuNow(b);
  const t0 = Date.now();
  const submitted = await Promise.all(dests.map(() => b.api.submitEncrypt(b.input, b.fingerprint)));
  const t1 = Date.now();
  const jobs = await Promise.all(submitted.map((j) => waitFor(b, j.job_id)));
  const t2 = Date.now();
  await Promise.all(jobs.map((j, i) => b.api.download(j.result!.files![0]!.download_url, dests[i]!)));
  const t3 = Date.now();
  await Promise.all(jobs.map((j) => dropJobFiles(b, j.job_id)));
  const starts = jobs.map((j) => Date.parse(j.started_at!));
  const ends = jobs.map((j) => Date.parse(j.finished_at!));
  const [start, end] = [Math.min(...starts), Math.max(...ends)];
  const bytes = 2 * b.size;
  const parts = { upload: t1 - t0, 'job 1': ends[0]! - starts[0]!, 'job 2': ends[1]! - starts[1]!, 'start skew': Math.abs(starts[0]! - starts[1]!), download: t3 - t2 };
  return {
    'parallel.jobs': { bytes, ms: end - start, parts, cpu: cpuSince(b, cpu0) },
    'parallel.service': { bytes, ms: t3 - t0 },
  };
}

/** CPU seconds so far of each service process and of this process (the client: upload, download). */
function cpuNow(b: Bench): Record<string, number> {
  const { user, system } = process.cpuUsage();
  return { ...b.service.cpu(), bench: (user + system) / 1e6 };
}

function cpuSince(b: Bench, before: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.entries(cpuNow(b)).map(([k, v]) => [k, v - (before[k] ?? 0)]));
}

// -------------------------------------------------------------------------------------- helpers

/** Times a baseline with its CPU: gpg's (reaped children) or OpenPGP.js's (this process). */
async function baseline(bytes: number, fn: () => Promise<unknown>): Promise<Timing> {
  const cpu0 = ownCpuSeconds();
  const start = performance.now();
  await fn();
  const ms = performance.now() - start;
  const cpu1 = ownCpuSeconds();
  const gpg = cpu1.children - cpu0.children;
  return { bytes, ms, cpu: gpg > 0 ? { gpg } : { bench: cpu1.self - cpu0.self } };
}

/**
 * Frees the disk a finished job's output holds until its retention ends (the API has no delete):
 * the blob store is the bench's own folder, laid out as `jobs/<id>/` (lib/services/jobs.ts).
 */
const dropJobFiles = (b: Bench, jobId: string) => rm(join(b.service.blobDir, 'jobs', jobId), { recursive: true, force: true });

/** The decrypt section's inputs: the encrypt section's outputs, or made now (untimed) when it did not run. */
async function ciphertexts(b: Bench): Promise<{ gpg: string; pgp: string; service: string }> {
  const c = b.cipher;
  if (!c.gpg) await b.gpg.encrypt(b.input, (c.gpg = path(b, 'gpg.gpg')));
  if (!c.pgp) await pgpEncrypt(b.input, (c.pgp = path(b, 'pgp.gpg')), b.pgp);
  if (!c.service) await serviceRun(b, () => b.api.submitEncrypt(b.input, b.fingerprint), (c.service = path(b, 'service.gpg')));
  return { gpg: c.gpg, pgp: c.pgp, service: c.service };
}

/** The decrypted file must be the original, byte for byte; it is deleted after the check. */
async function checkPlaintext(b: Bench, file: string, what: string): Promise<void> {
  const sha = await sha256File(file);
  await rm(file);
  if (sha !== b.inputSha) throw new Error(`${what}: output differs from the original (sha256 ${sha} ≠ ${b.inputSha})`);
}
