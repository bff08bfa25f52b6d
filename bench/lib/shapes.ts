/**
 * Decryption of each message shape the service reads, in this process, file to file on the bench's disk,
 * ÷ the common shape (binary, uncompressed SEIPDv1, as the service writes it to v4 keys) in the same run:
 * zlib compressed (gpg's default output), armored, SEIPDv2 with OCB and with GCM as the service writes it
 * to v6 keys (1 MiB chunks), and SEIPDv2 with GCM as OpenPGP.js writes it (256 KiB chunks). Also
 * encrypting with compression, and SEIPDv2, ÷ SEIPDv1 without. Per figure the fastest of `runs`, with the
 * process's peak RSS meanwhile; in a process of its own under the worker's node flags (shapesUnderWorkerFlags).
 */
import { once } from 'node:events';
import { createReadStream, createWriteStream } from 'node:fs';
import { copyFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import * as openpgp from 'openpgp';
import { generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { randomSecret } from '../../lib/lineage';
import { NodeSource, encryptStream, openEncrypted } from '../../lib/pgp/stream';
import { shapesRatios } from './report';
import { keepFastest, type Results, type Timing } from './sections';
import { extraFlags, procfileCommand } from './service';
import { MiB, mibPerSec, sha256File, spawnTracked, timedInProcess } from './util';

const read = (path: string) => createReadStream(path, { highWaterMark: MiB });
const LIMIT = Number.MAX_SAFE_INTEGER;
const SHAPES = ['v1', 'v1-zlib', 'v1-armored', 'v2-ocb', 'v2-gcm', 'v2-gcm-openpgpjs'] as const;
const V2 = ['v2-ocb', 'v2-gcm'] as const;

export async function measureShapes(input: string, size: number, dir: string, runs: number): Promise<Results> {
  const secret = randomSecret();
  const k = await generateKey({ name: 'Bench', email: 'bench@example.test', algorithm: 'curve25519', secret });
  const pub = await readStoredPublicKey(k.publicArmored);
  const priv = await unlockPrivateKey(k.privateArmored, secret);
  // v6 keys as OpenPGP.js makes them for a caller, one preferring each mode: the service writes SEIPDv2 to them.
  const v6 = Object.fromEntries(
    await Promise.all(
      V2.map(async (shape) => {
        const aead = shape === 'v2-ocb' ? openpgp.enums.aead.ocb : openpgp.enums.aead.gcm;
        const { privateKey } = await openpgp.generateKey({
          type: 'curve25519',
          userIDs: [{ name: 'Bench v6', email: 'bench-v6@example.test' }],
          format: 'object',
          config: { v6Keys: true, aeadProtect: true, preferredAEADAlgorithm: aead },
        });
        return [shape, privateKey] as const;
      }),
    ),
  ) as Record<(typeof V2)[number], openpgp.PrivateKey>;
  const keyOf = (shape: (typeof SHAPES)[number]) => (shape === 'v2-ocb' || shape === 'v2-gcm' ? v6[shape] : priv);
  const path = (shape: string) => join(dir, `shape-${shape}.pgp`);
  const plain = join(dir, 'shape-plain.bin');
  const cipher = join(dir, 'shape-cipher.bin');
  // Each output overwrites a file of its size in place, as the local blob store's spare files are reused: a new
  // file's pages cost a host that takes freed memory back more wall time than the decryption (bench/README.md,
  // "Memory the host takes back"), the same for every shape, which would hide the differences between them.
  const overwrite = (file: string) => createWriteStream(file, { flags: 'r+', highWaterMark: MiB });
  const write = async (shape: (typeof SHAPES)[number]) => {
    if (shape === 'v2-gcm-openpgpjs') {
      const sessionKey = { data: crypto.getRandomValues(new Uint8Array(32)), algorithm: 'aes256' as const, aeadAlgorithm: 'gcm' as const };
      const message = await openpgp.createMessage({ binary: new NodeSource(read(input)).open(), format: 'binary' });
      const out = await openpgp.encrypt({ message, encryptionKeys: pub, sessionKey, format: 'binary' });
      return pipeline(Readable.fromWeb(out), createWriteStream(path(shape)));
    }
    const opts = { armor: shape === 'v1-armored', compress: shape === 'v1-zlib' };
    return pipeline(await encryptStream(read(input), shape.startsWith('v2') ? keyOf(shape).toPublic() : pub, opts), createWriteStream(path(shape)));
  };
  const best: Results = {};
  const keep = (key: string, t: Timing & { rss: number }) => keepFastest(best, key, t);
  try {
    for (const shape of SHAPES) await write(shape);
    await Promise.all([plain, cipher].map((f) => copyFile(input, f)));
    for (let i = 0; i < runs; i++) {
      for (const [name, to, compress] of [
        ['encrypt', pub, false],
        ['encrypt-zlib', pub, true],
        ...V2.map((s) => [`encrypt-${s}`, v6[s].toPublic(), false] as const),
      ] as const) {
        keep(
          `shapes.${name}`,
          await peakRss(() => timedInProcess(size, async () => pipeline(await encryptStream(read(input), to, { armor: false, compress }), overwrite(cipher)))),
        );
      }
      for (const shape of SHAPES) {
        keep(
          `shapes.${shape}`,
          await peakRss(() =>
            timedInProcess(size, async () => {
              const m = await openEncrypted(read(path(shape)), { maxDecompressedBytes: LIMIT });
              await pipeline(await m.decrypt(keyOf(shape)), overwrite(plain));
            }),
          ),
        );
      }
    }
    if ((await sha256File(plain)) !== (await sha256File(input))) throw new Error('shapes: the last decryption is not the input');
  } finally {
    await Promise.all([...SHAPES.map(path), plain, cipher].map((p) => rm(p, { force: true })));
  }
  return best;
}

/**
 * measureShapes in a child process under the worker's node flags and environment from the Procfile (and
 * BENCH_NODE_FLAGS), as bench/pipeline.ts runs: V8's collector settings move these figures by half (the
 * bench process's defaults ran a mark-compact every ~5 MiB decrypted; docs/performance.md, "Process
 * flags"). Prints the summary; the child answers its results as its last line of output (bench/shapes.ts).
 */
export async function shapesUnderWorkerFlags(input: string, size: number, dir: string, runs: number): Promise<Results> {
  const { env, flags } = procfileCommand('worker');
  const script = fileURLToPath(new URL('../shapes.ts', import.meta.url));
  const child = spawnTracked(process.execPath, [...flags, ...extraFlags(), ...process.execArgv, script, input, String(size), dir, String(runs)], {
    env: { ...env, ...process.env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  const [code] = (await once(child, 'exit')) as [number | null];
  if (code !== 0) throw new Error(`shapes: the child process exited with ${code}`);
  const best = JSON.parse(out.trim().split('\n').at(-1)!) as Results;
  for (const line of shapesSummary(best)) console.log(line);
  return best;
}

/** The timing of `work` with the peak resident set sampled meanwhile (MiB). */
async function peakRss(work: () => Promise<Timing>): Promise<Timing & { rss: number }> {
  let peak = process.memoryUsage.rss();
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage.rss())), 50);
  try {
    const t = await work();
    return { ...t, rss: Math.max(peak, process.memoryUsage.rss()) / MiB };
  } finally {
    clearInterval(timer);
  }
}

/** `decrypt v1 900 MiB/s …; v1-zlib 450 MiB/s (÷ v1 0.50) …` */
export function shapesSummary(r: Results): string[] {
  const rate = (x: Timing) => mibPerSec(x.bytes, x.ms);
  const cpu = (x: Timing) => ((x.cpu?.user ?? 0) + (x.cpu?.sys ?? 0)).toFixed(2);
  const rss = (x: Timing) => ((x as Timing & { rss?: number }).rss ?? 0).toFixed(0);
  const base = r['shapes.v1'];
  const plainEnc = r['shapes.encrypt'];
  const zlibEnc = r['shapes.encrypt-zlib'];
  if (!base || !plainEnc || !zlibEnc) return [];
  const line = (name: string, x: Timing, of?: Timing) =>
    `${name} ${rate(x).toFixed(0)} MiB/s (CPU ${cpu(x)} s, peak RSS ${rss(x)} MiB${of ? `, ÷ ${(rate(x) / rate(of)).toFixed(2)}` : ''})`;
  const v2 = shapesRatios(r);
  const goal = (x: number | undefined) => (x === undefined ? '–' : `${x.toFixed(2)} ${x >= 1.5 ? 'ok' : 'MISSED'}`);
  return [
    `shapes, decrypt (÷ v1, binary uncompressed SEIPDv1): ${SHAPES.map((s) => (r[`shapes.${s}`] ? line(s, r[`shapes.${s}`], s === 'v1' ? undefined : base) : '')).join('; ')}`,
    `shapes, SEIPDv2 as we write it ÷ SEIPDv1, decrypt (≥ 1.5): OCB ${goal(v2.shapes_v2_ocb_vs_v1_decrypt)} · GCM ${goal(v2.shapes_v2_gcm_vs_v1_decrypt)}`,
    `shapes, encrypt (÷ without compression, SEIPDv1): ${line('without', plainEnc)}; ${line('zlib', zlibEnc, plainEnc)}${V2.map((s) => (r[`shapes.encrypt-${s}`] ? `; ${line(s, r[`shapes.encrypt-${s}`], plainEnc)}` : '')).join('')}`,
  ];
}
