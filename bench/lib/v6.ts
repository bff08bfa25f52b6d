/**
 * The `v6` section: a file's round trip through the service to a v6 key (RFC 9580: PKESK v6 + SEIPDv2,
 * written on Node's crypto), against what a user would script instead, in the same run:
 * - the service: the upload with the caller's v6 public key (`public_key`), the job, and the ciphertext
 *   downloaded as it is produced (followed, as the encrypt section does; `--no-follow`: after the job);
 * - the script: the file PUT to a plain HTTP server writing it to disk (disk-server.mjs, its own process),
 *   `gpg -e` of it there (the bench's v4 key, no compression), the ciphertext downloaded with GET.
 * Then the service decrypts the v6 file (the v6 key imported into it) and gpg its own, for the worker's CPU
 * per GiB over encrypting and decrypting (each job's whole span) ÷ gpg's for `-e` and `-d`.
 */
import { once } from 'node:events';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, rm, stat } from 'node:fs/promises';
import { type IncomingMessage, request } from 'node:http';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import * as openpgp from 'openpgp';
import { gpgCpuPerGiB, v6Ratios, workerCpuPerGiB } from './report';
import { MiB, cpuSeconds, mibPerSec, ownCpuSeconds, spawnTracked, stopChild, writeRandomFile } from './util';
import { type Bench, type Results, type Timing, baseline, checkPlaintext, followedRun, keepFastest, serviceFigures, serviceRun, settle } from './sections';

export async function v6Section(b: Bench): Promise<Results> {
  // OpenPGP.js's v6 key as a caller would bring it: its preferences list GCM first, then OCB.
  const { privateKey } = await openpgp.generateKey({
    type: 'curve25519',
    userIDs: [{ name: 'Bench v6', email: 'bench-v6@example.com' }],
    format: 'object',
    config: { v6Keys: true, aeadProtect: true },
  });
  const publicKey = privateKey.toPublic().armor();
  const imported = await b.api.importKey(privateKey.armor(), b.passphrase);
  const disk = await DiskServer.start(join(b.dir, 'disk-server'));
  const [svcOut, svcPlain, gpgOut, gpgPlain] = ['v6-service.pgp', 'v6-service.out', 'v6-gpg.gpg', 'v6-gpg.out'].map((f) => join(b.dir, f));
  const best: Results = {};
  try {
    // Untimed, a 1 MiB job first: with `--only v6` the worker would otherwise load OpenPGP.js and compile this path in the timed one.
    const small = join(b.dir, 'v6-warm-up.bin');
    await writeRandomFile(small, MiB);
    await b.api.waitForJob((await b.api.submitEncrypt(small, { publicKey })).job_id, 60_000);
    await rm(small);
    for (let i = 0; i < b.runs; i++) {
      const encrypted = b.follow ? await followedRun(b, svcOut, { publicKey }) : await serviceRun(b, () => b.api.submitEncrypt(b.input, { publicKey }), svcOut);
      const encrypt = serviceFigures('v6', encrypted)['v6.service'];
      const decrypt = await decryptRun(b, imported, svcOut, svcPlain);
      await checkPlaintext(b, svcPlain, 'v6: service decrypt download');
      await rm(svcOut);
      const scripted = await scriptedRun(b, disk, gpgOut);
      const gpgDecrypt = await baseline(b.size, () => b.gpg.decrypt(gpgOut, gpgPlain));
      await checkPlaintext(b, gpgPlain, 'v6: gpg decrypt');
      await rm(gpgOut);
      for (const [k, t] of Object.entries({ 'v6.service': encrypt, 'v6.service-decrypt': decrypt, 'v6.scripted': scripted, 'v6.gpg-decrypt': gpgDecrypt }))
        keepFastest(best, k, t);
    }
  } finally {
    await disk.stop();
  }
  for (const line of v6Summary(best)) console.log(line);
  return best;
}

/** The service's decryption of the v6 file, with the imported key. */
async function decryptRun(b: Bench, fingerprint: string, input: string, dest: string): Promise<Timing> {
  return serviceFigures('v6', { ...(await serviceRun(b, () => b.api.submitDecrypt(input, fingerprint, b.passphrase), dest)), bytes: b.size })['v6.service'];
}

/** PUT to the disk server, `gpg -e` of the file it wrote, GET of the ciphertext: each step timed, with its CPU. */
async function scriptedRun(b: Bench, disk: DiskServer, dest: string): Promise<Timing> {
  await settle();
  const t0 = performance.now();
  const c0 = cpuOf(disk);
  await disk.put(b.input, 'plain.bin');
  const t1 = performance.now();
  const c1 = cpuOf(disk);
  const g0 = ownCpuSeconds().children; // gpg, reaped
  await b.gpg.encrypt(disk.path('plain.bin'), disk.path('plain.bin.gpg'));
  const gpg = ownCpuSeconds().children - g0;
  const t2 = performance.now();
  const c2 = cpuOf(disk);
  await disk.get('plain.bin.gpg', dest);
  const t3 = performance.now();
  const c3 = cpuOf(disk);
  await Promise.all(['plain.bin', 'plain.bin.gpg'].map((f) => rm(disk.path(f), { force: true })));
  const step = (a: Record<string, number>, z: Record<string, number>) => Object.fromEntries(Object.entries(z).map(([k, v]) => [k, v - (a[k] ?? 0)]));
  const phaseCpu = { upload: step(c0, c1), 'gpg -e': { ...step(c1, c2), gpg }, download: step(c2, c3) };
  const cpu: Record<string, number> = {};
  for (const phase of Object.values(phaseCpu)) for (const [k, v] of Object.entries(phase)) cpu[k] = (cpu[k] ?? 0) + v;
  return { bytes: b.size, ms: t3 - t0, parts: { upload: t1 - t0, 'gpg -e': t2 - t1, download: t3 - t2 }, phaseCpu, cpu };
}

const cpuOf = (disk: DiskServer) => ({ 'disk server': cpuSeconds(disk.pid), bench: ownCpuSeconds().self });

/** disk-server.mjs in a child process, and a client of it as a user's script would be (node:http, files streamed). */
class DiskServer {
  private constructor(
    private readonly child: ReturnType<typeof spawnTracked>,
    private readonly port: number,
    private readonly dir: string,
  ) {}

  static async start(dir: string): Promise<DiskServer> {
    await mkdir(dir, { recursive: true });
    const child = spawnTracked(process.execPath, [fileURLToPath(new URL('./disk-server.mjs', import.meta.url)), dir], { stdio: ['ignore', 'pipe', 'inherit'] });
    const [line] = (await once(createInterface({ input: child.stdout! }), 'line')) as [string];
    return new DiskServer(child, Number(line), dir);
  }

  get pid(): number {
    return this.child.pid!;
  }

  path(name: string): string {
    return join(this.dir, name);
  }

  async put(file: string, name: string): Promise<void> {
    const req = request({ host: '127.0.0.1', port: this.port, path: `/${name}`, method: 'PUT', headers: { 'content-length': (await stat(file)).size } });
    const answer = once(req, 'response') as Promise<[IncomingMessage]>;
    await pipeline(createReadStream(file, { highWaterMark: MiB }), req);
    const [res] = await answer;
    res.resume();
    if (res.statusCode !== 201) throw new Error(`disk server: PUT ${name} → ${res.statusCode}`);
  }

  async get(name: string, dest: string): Promise<void> {
    const req = request({ host: '127.0.0.1', port: this.port, path: `/${name}`, method: 'GET' });
    req.end();
    const [res] = (await once(req, 'response')) as [IncomingMessage];
    if (res.statusCode !== 200) throw new Error(`disk server: GET ${name} → ${res.statusCode}`);
    await pipeline(res, createWriteStream(dest, { highWaterMark: MiB }));
  }

  stop(): Promise<void> {
    return stopChild(this.child, 2000);
  }
}

/** `v6 round trip: service 310 MiB/s ÷ scripted 190 MiB/s = 1.63 …; worker CPU-s/GiB …` */
export function v6Summary(r: Results): string[] {
  const q = v6Ratios(r);
  const rate = (t: Timing | undefined) => (t ? `${mibPerSec(t.bytes, t.ms).toFixed(0)} MiB/s` : '–');
  const f = (x: number | undefined) => (x === undefined ? '–' : x.toFixed(2));
  const verdict = (x: number | undefined, ok: boolean) => (x === undefined ? '' : ok ? ' ok' : ' MISSED');
  const worker = [workerCpuPerGiB(r['v6.service']), workerCpuPerGiB(r['v6.service-decrypt'])];
  const gpg = [gpgCpuPerGiB(r['v6.scripted'], 'gpg -e'), gpgCpuPerGiB(r['v6.gpg-decrypt'])];
  return [
    `v6 round trip (upload → job → download to a supplied v6 key, SEIPDv2) ÷ scripted (PUT to disk, gpg -e with a v4 key, GET): ${rate(r['v6.service'])} ÷ ${rate(r['v6.scripted'])} = ${f(q.v6_roundtrip_vs_scripted)} (≥ 1.5${verdict(q.v6_roundtrip_vs_scripted, (q.v6_roundtrip_vs_scripted ?? 0) >= 1.5)})`,
    `v6 worker CPU-s per GiB, encrypt + decrypt (each job's whole span) ÷ gpg -e + gpg -d of its own v4 file: (${f(worker[0])} + ${f(worker[1])}) ÷ (${f(gpg[0])} + ${f(gpg[1])}) = ${f(q.v6_worker_cpu_vs_gpg)}`,
  ];
}
