/**
 * Decryption of each message shape the service reads, in this process, file to file on the bench's disk,
 * ÷ the common shape (binary, uncompressed SEIPDv1, as the service writes it) in the same run: zlib
 * compressed (gpg's default output), armored, SEIPDv2 with GCM (written by OpenPGP.js). Also encrypting
 * with compression ÷ without. Per figure the fastest of `runs`, with the process's peak RSS meanwhile.
 */
import { createReadStream, createWriteStream } from 'node:fs';
import { rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import * as openpgp from 'openpgp';
import { generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { randomSecret } from '../../lib/lineage';
import { NodeSource, encryptStream, openEncrypted } from '../../lib/pgp/stream';
import { keepFastest, type Results, type Timing } from './sections';
import { MiB, mibPerSec, timedInProcess } from './util';

const read = (path: string) => createReadStream(path, { highWaterMark: MiB });
const LIMIT = Number.MAX_SAFE_INTEGER;
const SHAPES = ['v1', 'v1-zlib', 'v1-armored', 'v2-gcm'] as const;

export async function measureShapes(input: string, size: number, dir: string, runs: number): Promise<Results> {
  const secret = randomSecret();
  const k = await generateKey({ name: 'Bench', email: 'bench@example.test', algorithm: 'curve25519', secret });
  const pub = await readStoredPublicKey(k.publicArmored);
  const priv = await unlockPrivateKey(k.privateArmored, secret);
  const path = (shape: string) => join(dir, `shape-${shape}.pgp`);
  const plain = join(dir, 'shape-plain.bin');
  const write = async (shape: (typeof SHAPES)[number]) => {
    if (shape === 'v2-gcm') {
      const sessionKey = { data: crypto.getRandomValues(new Uint8Array(32)), algorithm: 'aes256' as const, aeadAlgorithm: 'gcm' as const };
      const message = await openpgp.createMessage({ binary: new NodeSource(read(input)).open(), format: 'binary' });
      const out = await openpgp.encrypt({ message, encryptionKeys: pub, sessionKey, format: 'binary' });
      return pipeline(Readable.fromWeb(out), createWriteStream(path(shape)));
    }
    const opts = { armor: shape === 'v1-armored', compress: shape === 'v1-zlib' };
    return pipeline(await encryptStream(read(input), pub, opts), createWriteStream(path(shape)));
  };
  const best: Results = {};
  const keep = (key: string, t: Timing & { rss: number }) => keepFastest(best, key, t);
  try {
    for (const shape of SHAPES) await write(shape);
    for (let i = 0; i < runs; i++) {
      for (const compress of [false, true]) {
        keep(
          `shapes.encrypt${compress ? '-zlib' : ''}`,
          await peakRss(() =>
            timedInProcess(size, async () => pipeline(await encryptStream(read(input), pub, { armor: false, compress }), createWriteStream(plain))),
          ),
        );
      }
      for (const shape of SHAPES) {
        keep(
          `shapes.${shape}`,
          await peakRss(() =>
            timedInProcess(size, async () => {
              const m = await openEncrypted(read(path(shape)), { maxDecompressedBytes: LIMIT });
              await pipeline(await m.decrypt(priv), createWriteStream(plain));
            }),
          ),
        );
      }
    }
    if ((await stat(plain)).size !== size) throw new Error('shapes: the last decryption is not the size of the input');
  } finally {
    await Promise.all([...SHAPES.map(path), plain].map((p) => rm(p, { force: true })));
  }
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
  return [
    `shapes, decrypt (÷ v1, binary uncompressed SEIPDv1): ${SHAPES.map((s) => (r[`shapes.${s}`] ? line(s, r[`shapes.${s}`], s === 'v1' ? undefined : base) : '')).join('; ')}`,
    `shapes, encrypt (÷ without compression): ${line('without', plainEnc)}; ${line('zlib', zlibEnc, plainEnc)}`,
  ];
}
