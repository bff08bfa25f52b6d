import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { pgpDecrypt, pgpEncrypt, type Gpg, type PgpKeys } from './baselines';
import type { Api, JobView, Recipient } from './client';
import type { Service } from './service';
import { backendCpuCounter, ownCpuSeconds, run, sha256File } from './util';

/**
 * What every section works with. Files are deleted as soon as they are not needed: on a virtualised
 * host that takes back freed memory, writing into memory the guest has not touched recently costs
 * several times more kernel CPU, so a bigger footprint slows whichever measurement comes later
 * (bench/README.md, "Memory the host takes back").
 */
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
  /** Whether the decrypt section will want the encrypt section's outputs. */
  keepCiphertexts: boolean;
  /** Encrypt end to end downloads the ciphertext while it is produced (as the client library does), not after the job. */
  follow: boolean;
}

/** One timed thing: `bytes` in `ms`, plus an optional break-down of where the time went. */
export interface Timing {
  bytes: number;
  ms: number;
  /** Wall time of each step (ms). */
  parts?: Record<string, number>;
  /** CPU seconds per process, in total and per step. */
  cpu?: Record<string, number>;
  phaseCpu?: Record<string, Record<string, number>>;
  /** Work counted over the run (Service.workCounters): Postgres write transactions, WAL, Redis commands. */
  work?: Record<string, number>;
  /** The download ran during the upload and the job (`?follow=true`): the API's phases overlap. */
  followed?: boolean;
}

export type Results = Record<string, Timing>;

const path = (b: Bench, name: string) => join(b.dir, name);

/** Keeps `t` as `best[key]` when it is the fastest so far (the least disturbed run). */
export function keepFastest(best: Results, key: string, t: Timing): void {
  if (!best[key] || t.ms < best[key].ms) best[key] = t;
}

/** Runs `measure` b.runs times and keeps, per figure, the fastest run. */
async function bestOf(b: Bench, measure: () => Promise<Results>): Promise<Results> {
  const best: Results = {};
  for (let i = 0; i < b.runs; i++) {
    for (const [k, t] of Object.entries(await measure())) keepFastest(best, k, t);
  }
  return best;
}

// ------------------------------------------------------------------------------------- sections

export function encryptSection(b: Bench): Promise<Results> {
  const [gpgOut, pgpOut, svcOut] = [path(b, 'gpg.gpg'), path(b, 'pgp.gpg'), path(b, 'service.gpg')];
  return bestOf(b, async () => {
    const gpg = await baseline(b.size, () => b.gpg.encrypt(b.input, gpgOut));
    const pgp = await baseline(b.size, () => pgpEncrypt(b.input, pgpOut, b.pgp));
    const service = b.follow ? await followedRun(b, svcOut) : await serviceRun(b, () => b.api.submitEncrypt(b.input, b.fingerprint), svcOut);
    if (b.keepCiphertexts) Object.assign(b.cipher, { gpg: gpgOut, pgp: pgpOut, service: svcOut });
    else await Promise.all([gpgOut, pgpOut, svcOut].map((f) => rm(f)));
    return { 'encrypt.gpg': gpg, 'encrypt.openpgp': pgp, ...serviceFigures('encrypt', service) };
  });
}

export async function decryptSection(b: Bench): Promise<Results> {
  const cipher = await ciphertexts(b);
  const [gpgOut, pgpOut, svcOut] = [path(b, 'gpg.out'), path(b, 'pgp.out'), path(b, 'service.out')];
  const results = await bestOf(b, async () => {
    const gpg = await baseline(b.size, () => b.gpg.decrypt(cipher.gpg, gpgOut));
    await checkPlaintext(b, gpgOut, 'gpg decrypt');
    const pgp = await baseline(b.size, () => pgpDecrypt(cipher.pgp, pgpOut, b.pgp));
    await checkPlaintext(b, pgpOut, 'OpenPGP.js decrypt');
    const service = await serviceRun(b, () => b.api.submitDecrypt(cipher.service, b.fingerprint, b.passphrase), svcOut);
    await checkPlaintext(b, svcOut, 'service decrypt download');
    // Throughput counts plaintext bytes on both sides, like the encrypt figures.
    return { 'decrypt.gpg': gpg, 'decrypt.openpgp': pgp, ...serviceFigures('decrypt', { ...service, bytes: b.size }) };
  });
  await Promise.all(Object.values(cipher).map((f) => rm(f)));
  b.cipher = {};
  return results;
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

/** Rotations of this many keys at once, through the `rotation` queue. */
export const ROTATION_KEYS = 40;
/** Untimed rotations before the timed ones, per worker count: V8 is still compiling the hot path for ~15 s. */
const ROTATION_WARMUP_MS = 15_000;
/** Batches of ROTATION_KEYS in one timed run. */
const ROTATION_BATCHES = 10;

/**
 * Rotations per second through the queue: ROTATION_KEYS curve25519 keys rotated at once (submit all,
 * then wait for every job), first with one `rotation` worker process, then with two. The first batch on
 * fresh processes is timed on its own (`rotation.<n>w.cold`: V8 has not compiled the hot path yet), then
 * batches run untimed for ROTATION_WARMUP_MS, then ROTATION_BATCHES batches are timed (the steady state,
 * as the list latency is measured after a warm-up).
 */
export async function rotationSection(b: Bench): Promise<Results> {
  const keys: RotatedKey[] = [];
  for (let i = 0; i < ROTATION_KEYS; i++) keys.push({ api: b.api, fingerprint: await b.api.generateKey(b.passphrase) });
  const batch = () => rotateAll(b, keys);
  const timed = async (key: string, batches: number) => {
    await b.service.vacuum();
    return { [key]: await timedRotations(b, batch, batches) };
  };
  const results: Results = {};
  for (const workers of [1, 2]) {
    while (b.service.workerCount('rotation') < workers) await b.service.addWorker('rotation=4');
    Object.assign(results, await timed(`rotation.${workers}w.cold`, 1));
    for (const until = Date.now() + ROTATION_WARMUP_MS; Date.now() < until;) await batch();
    Object.assign(results, await bestOf(b, () => timed(`rotation.${workers}w`, ROTATION_BATCHES)));
  }
  return results;
}

/** A key to rotate, and the client of the account that holds it. */
export interface RotatedKey {
  api: Api;
  fingerprint: string;
}

/**
 * One rotation of every key at once, as the scheduler's sweep enqueues every due key: each submitted as the
 * client library does (`Prefer: wait`), then long polling for those that had not ended by the answer.
 * Resolves with the number of rotations once all have ended; a failed or stuck one throws.
 */
export async function rotateAll(b: Bench, keys: RotatedKey[]): Promise<number> {
  const jobs = await Promise.all(keys.map((k) => k.api.rotate(k.fingerprint).then((job) => ({ job, api: k.api }))));
  const wait = (api: Api, id: string) =>
    api
      .waitForJob(id, 120_000, () => b.service.assertRunning())
      .catch(async (err: Error) => {
        throw new Error(`${err.message}; ${await b.service.stuckJobReport('rotation', id).catch((e: Error) => `no report: ${e.message}`)}`);
      });
  await Promise.all(jobs.filter(({ job }) => job.state !== 'completed').map(({ job, api }) => wait(api, job.job_id)));
  return jobs.length;
}

/** `batches` calls of `batch` (each resolving with its rotation count), timed, with every process's CPU (the service's Postgres backends summed). */
export async function timedRotations(b: Bench, batch: () => Promise<number>, batches: number): Promise<Timing> {
  const w0 = await b.service.workCounters();
  const postgresCpuSeconds = backendCpuCounter(b.service.database);
  const m0 = { ...mark(b), postgres: postgresCpuSeconds() };
  let rotations = 0;
  for (let i = 0; i < batches; i++) rotations += await batch();
  const m1 = { ...mark(b), postgres: postgresCpuSeconds() };
  const w1 = await b.service.workCounters();
  const work = Object.fromEntries(Object.entries(w1).map(([k, v]) => [k, v - w0[k]]));
  return { bytes: rotations, ms: m1.t - m0.t, cpu: { ...cpuBetween(m0, m1), postgres: m1.postgres - m0.postgres }, work };
}

// -------------------------------------------------------------------------------------- service

/** A moment with every process's CPU seconds so far, to split a run into phases. */
interface Mark {
  t: number;
  cpu: Record<string, number>;
}

function mark(b: Bench): Mark {
  const { user, system } = process.cpuUsage();
  return { t: Date.now(), cpu: { ...b.service.cpu(), bench: (user + system) / 1e6 } };
}

/** CPU seconds per process between two marks; processes that used under 0.05 s are left out. */
function cpuBetween(a: Mark, z: Mark): Record<string, number> {
  return Object.fromEntries(
    Object.entries(z.cpu)
      .map(([k, v]): [string, number] => [k, v - (a.cpu[k] ?? 0)])
      .filter(([, v]) => v >= 0.05),
  );
}

interface ServiceRun {
  bytes: number;
  /** Submit start, 202 received, completion seen, download end. */
  marks: [Mark, Mark, Mark, Mark];
  job: JobView;
  followed?: boolean;
}

/** upload → 202 → poll until completed → download to `dest`, marking each step. */
export async function serviceRun(b: Bench, submit: () => Promise<JobView>, dest: string): Promise<ServiceRun> {
  await settle();
  const m0 = mark(b);
  const { job_id } = await submit();
  const m1 = mark(b);
  const job = await waitFor(b, job_id);
  const m2 = mark(b);
  const bytes = await b.api.download(job.result!.files![0].download_url, dest);
  const m3 = mark(b);
  await dropJobFiles(b, job_id);
  return { bytes, marks: [m0, m1, m2, m3], job };
}

/**
 * An encryption as a client that wants the ciphertext soonest runs it: the upload, and the download of
 * the output as it is produced (`?follow=true`, started when the 103 Early Hints name the job), at once.
 * Marks: submit start, 202 received, completion seen, download end.
 */
export async function followedRun(b: Bench, dest: string, to: Recipient = b.fingerprint): Promise<ServiceRun> {
  await settle();
  const m0 = mark(b);
  let m2!: Mark;
  const {
    job: { job_id },
    downloaded,
  } = await b.api.submitEncryptFollowed(b.input, to, dest);
  const m1 = mark(b);
  const [job, bytes] = await Promise.all([waitFor(b, job_id).then((j) => ((m2 = mark(b)), j)), downloaded]);
  const m3 = mark(b);
  await dropJobFiles(b, job_id);
  return { bytes, marks: [m0, m1, m2, m3], job, followed: true };
}

/** Generous: 2 minutes plus 2 minutes per GiB (about 8 MiB/s), in case a job never ends. */
const waitFor = (b: Bench, jobId: string) => b.api.waitForJob(jobId, 120_000 * (1 + b.size / 2 ** 30), () => b.service.assertRunning());

/**
 * e2e (upload start → download end) and job-only (the job's started_at → finished_at) figures. The CPU
 * shown with `job` covers 202 → completion seen (queue, job and poll).
 */
export function serviceFigures(kind: string, r: ServiceRun): Results {
  const [m0, m1, m2, m3] = r.marks;
  const started = Date.parse(r.job.started_at!);
  const finished = Date.parse(r.job.finished_at!);
  // A followed download runs with the upload and the job: what is left of it after the job is its end.
  const [upload, download] = r.followed ? ['upload + download', 'download end'] : ['upload', 'download'];
  const parts = { [upload]: m1.t - m0.t, queue: started - m1.t, job: finished - started, poll: m2.t - finished, [download]: m3.t - m2.t };
  const cpu = { [upload]: cpuBetween(m0, m1), job: cpuBetween(m1, m2), [download]: cpuBetween(m2, m3) };
  return {
    [`${kind}.service`]: { bytes: r.bytes, ms: m3.t - m0.t, parts, phaseCpu: cpu, cpu: cpuBetween(m0, m3), followed: r.followed },
    [`${kind}.job`]: { bytes: r.bytes, ms: finished - started },
  };
}

async function parallelServiceRun(b: Bench, dests: string[]): Promise<Results> {
  await settle();
  const m0 = mark(b);
  const submitted = await Promise.all(dests.map(() => b.api.submitEncrypt(b.input, b.fingerprint)));
  const m1 = mark(b);
  const jobs = await Promise.all(submitted.map((j) => waitFor(b, j.job_id)));
  const m2 = mark(b);
  await Promise.all(jobs.map((j, i) => b.api.download(j.result!.files![0].download_url, dests[i])));
  const m3 = mark(b);
  await Promise.all(jobs.map((j) => dropJobFiles(b, j.job_id)));
  const starts = jobs.map((j) => Date.parse(j.started_at!));
  const ends = jobs.map((j) => Date.parse(j.finished_at!));
  const [start, end] = [Math.min(...starts), Math.max(...ends)];
  const bytes = 2 * b.size;
  const parts = {
    upload: m1.t - m0.t,
    jobs: end - start,
    'job 1': ends[0] - starts[0],
    'job 2': ends[1] - starts[1],
    'start skew': Math.abs(starts[0] - starts[1]),
    download: m3.t - m2.t,
  };
  const phaseCpu = { upload: cpuBetween(m0, m1), jobs: cpuBetween(m1, m2), download: cpuBetween(m2, m3) };
  return {
    'parallel.jobs': { bytes, ms: end - start, parts, phaseCpu, cpu: cpuBetween(m0, m3) },
    'parallel.service': { bytes, ms: m3.t - m0.t },
  };
}

// -------------------------------------------------------------------------------------- helpers

/** Times a baseline with its CPU: gpg's (reaped children) or OpenPGP.js's (this process). */
export async function baseline(bytes: number, fn: () => Promise<unknown>): Promise<Timing> {
  await settle();
  const cpu0 = ownCpuSeconds();
  const start = performance.now();
  await fn();
  const ms = performance.now() - start;
  const cpu1 = ownCpuSeconds();
  const gpg = cpu1.children - cpu0.children;
  return { bytes, ms, cpu: gpg > 0 ? { gpg } : { bench: cpu1.self - cpu0.self } };
}

/**
 * Writes dirty pages out before each measurement, so none pays for the previous one's writeback (with
 * a disk-backed temp dir, 1 GiB figures otherwise swing with how much the earlier steps left dirty).
 */
export const settle = () => run('sync', []);

/**
 * Frees the disk a finished job's output holds until its retention ends (the API has no delete):
 * the blob store is the bench's own folder, laid out as `jobs/<id>/` (lib/jobs/job-records.ts).
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
export async function checkPlaintext(b: Bench, file: string, what: string): Promise<void> {
  const sha = await sha256File(file);
  await rm(file);
  if (sha !== b.inputSha) throw new Error(`${what}: output differs from the original (sha256 ${sha} ≠ ${b.inputSha})`);
}
