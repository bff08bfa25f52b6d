/**
 * What rewrap and re-encryption cost, in this process, file to file on the bench's disk:
 * - rewrap (lib/pgp/rewrap.ts: new session-key packet, data packet copied while its MDC is checked on
 *   the side) ÷ a plain copy of the same file (a stream pipeline, as the job's blob put is);
 * - reencrypt (decrypt piped into encrypt, a fresh session key) ÷ decrypt then encrypt run one after
 *   the other. Per figure the fastest of `runs`.
 */
import { createReadStream, createWriteStream } from 'node:fs';
import { rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { randomSecret } from '../../lib/lineage';
import { encryptStream, openEncrypted } from '../../lib/pgp/stream';
import { openForRewrap } from '../../lib/pgp/rewrap';
import { keepFastest, type Results, type Timing } from './sections';
import { MiB, mibPerSec, timedInProcess } from './util';

const read = (path: string) => createReadStream(path, { highWaterMark: MiB });
const LIMIT = Number.MAX_SAFE_INTEGER;

export async function measureRewrap(input: string, size: number, dir: string, runs: number): Promise<Results> {
  const keys = await Promise.all(
    [1, 2].map(async (n) => {
      const secret = randomSecret();
      const k = await generateKey({ name: `Bench ${n}`, email: `bench${n}@example.test`, algorithm: 'curve25519', secret });
      return { ids: k.encryptionKeyIds, pub: await readStoredPublicKey(k.publicArmored), priv: await unlockPrivateKey(k.privateArmored, secret) };
    }),
  );
  const [a, b] = keys as [(typeof keys)[0], (typeof keys)[0]];
  const message = join(dir, 'rewrap-in.gpg');
  const out = join(dir, 'rewrap-out.gpg');
  const plain = join(dir, 'rewrap-plain.bin');
  await pipeline(await encryptStream(read(input), a.pub, { armor: false }), createWriteStream(message));
  const bytes = (await stat(message)).size;
  const best: Results = {};
  const keep = (key: string, t: Timing) => keepFastest(best, key, t);
  try {
    for (let i = 0; i < runs; i++) {
      keep('rewrap.copy', await timedInProcess(bytes, () => pipeline(read(message), createWriteStream(out))));
      keep(
        'rewrap.rewrap',
        await timedInProcess(bytes, async () => {
          const opened = await openForRewrap(read(message));
          await pipeline(await opened.rewrap(a.priv, a.ids, b.pub), createWriteStream(out));
        }),
      );
      keep(
        'rewrap.decrypt',
        await timedInProcess(size, async () => {
          const m = await openEncrypted(read(message), { maxDecompressedBytes: LIMIT });
          await pipeline(await m.decrypt(a.priv), createWriteStream(plain));
        }),
      );
      keep(
        'rewrap.encrypt',
        await timedInProcess(size, async () => pipeline(await encryptStream(read(plain), b.pub, { armor: false }), createWriteStream(out))),
      );
      keep(
        'rewrap.reencrypt',
        await timedInProcess(size, async () => {
          const m = await openEncrypted(read(message), { maxDecompressedBytes: LIMIT });
          await pipeline(await encryptStream(await m.decrypt(a.priv), b.pub, { armor: false }), createWriteStream(out));
        }),
      );
    }
  } finally {
    await Promise.all([message, out, plain].map((p) => rm(p, { force: true })));
  }
  for (const line of rewrapSummary(best)) console.log(line);
  return best;
}

/** `rewrap 1000 MiB/s ÷ copy 1200 MiB/s = 0.83; reencrypt … ÷ decrypt + encrypt …` */
export function rewrapSummary(r: Results): string[] {
  const t = (k: string) => r[`rewrap.${k}`];
  const [copy, rewrap, dec, enc, re] = ['copy', 'rewrap', 'decrypt', 'encrypt', 'reencrypt'].map(t);
  if (!copy || !rewrap || !dec || !enc || !re) return [];
  const rate = (x: Timing) => mibPerSec(x.bytes, x.ms);
  const cpu = (x: Timing) => ((x.cpu?.user ?? 0) + (x.cpu?.sys ?? 0)).toFixed(2);
  return [
    `rewrap: ${rate(rewrap).toFixed(0)} MiB/s (CPU ${cpu(rewrap)} s) ÷ plain copy ${rate(copy).toFixed(0)} MiB/s (CPU ${cpu(copy)} s) = ${(rate(rewrap) / rate(copy)).toFixed(2)} (target ≥ 0.8)`,
    `reencrypt: ${rate(re).toFixed(0)} MiB/s ÷ decrypt + encrypt ${mibPerSec(dec.bytes, dec.ms + enc.ms).toFixed(0)} MiB/s (decrypt ${rate(dec).toFixed(0)}, encrypt ${rate(enc).toFixed(0)}) = ${((dec.ms + enc.ms) / re.ms).toFixed(2)}`,
  ];
}
