/**
 * What signatures cost, in this process, file to file on the bench's disk, against gpg in the same run:
 * - sign-and-encrypt (lib/pgp/stream.ts encryptStream with a signing key: one pass, one-pass signature
 *   inside the encryption) ÷ `gpg -se`, in CPU seconds (target ≤ 2.0);
 * - verify of a detached signature (lib/pgp/signatures.ts verifyDetached) ÷ `gpg --verify`.
 * Both on Curve25519 keys (ours and gpg's future-default). Per figure the fastest of `runs`.
 */
import { createReadStream, createWriteStream } from 'node:fs';
import { readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { randomSecret } from '../../lib/lineage';
import { encryptStream } from '../../lib/pgp/stream';
import { readDetachedSignature, signStream, verifyDetached } from '../../lib/pgp/signatures';
import type { Gpg } from './baselines';
import { keepFastest, type Results, type Timing } from './sections';
import { MiB, mibPerSec, ownCpuSeconds, run, timedInProcess } from './util';

const read = (path: string) => createReadStream(path, { highWaterMark: MiB });

/** gpg's own run, timed with the CPU of the (reaped) child. */
async function timedGpg(bytes: number, work: () => Promise<void>): Promise<Timing> {
  await run('sync', []);
  const c0 = ownCpuSeconds().children;
  const t0 = performance.now();
  await work();
  return { bytes, ms: performance.now() - t0, cpu: { user: ownCpuSeconds().children - c0, sys: 0 } };
}

export async function measureSignatures(input: string, size: number, dir: string, runs: number, gpg: Gpg): Promise<Results> {
  const secret = randomSecret();
  const k = await generateKey({ name: 'Bench Signer', email: 'signer@example.test', algorithm: 'curve25519', secret });
  const priv = await unlockPrivateKey(k.privateArmored, secret);
  const pub = await readStoredPublicKey(k.publicArmored);
  const out = join(dir, 'signatures-out.gpg');
  const sig = join(dir, 'signatures.sig');
  const gpgSig = join(dir, 'signatures-gpg.sig');
  await pipeline(await signStream(read(input), priv, { detached: true, armor: false }), createWriteStream(sig));
  await gpg.detachSign(input, gpgSig);
  const signature = await readDetachedSignature(await readFile(sig));
  const best: Results = {};
  const keep = (key: string, t: Timing) => keepFastest(best, key, t);
  try {
    for (let i = 0; i < runs; i++) {
      keep(
        'signatures.sign_encrypt',
        await timedInProcess(size, async () => pipeline(await encryptStream(read(input), pub, { armor: false, signingKey: priv }), createWriteStream(out))),
      );
      keep('signatures.gpg_sign_encrypt', await timedGpg(size, () => gpg.signEncrypt(input, out)));
      keep(
        'signatures.verify',
        await timedInProcess(
          size,
          async () =>
            void (await verifyDetached(read(input), signature, [{ key: pub, fingerprint: k.fingerprint }], { maxDecompressedBytes: Number.MAX_SAFE_INTEGER })),
        ),
      );
      keep('signatures.gpg_verify', await timedGpg(size, () => gpg.verify(gpgSig, input)));
    }
  } finally {
    await Promise.all([out, sig, gpgSig].map((p) => rm(p, { force: true })));
  }
  for (const line of signaturesSummary(best)) console.log(line);
  return best;
}

/** `sign-and-encrypt CPU 3.1 s ÷ gpg -se 2.0 s = 1.55 (target ≤ 2.0); verify …` */
export function signaturesSummary(r: Results): string[] {
  const [se, gse, v, gv] = ['sign_encrypt', 'gpg_sign_encrypt', 'verify', 'gpg_verify'].map((k) => r[`signatures.${k}`]);
  if (!se || !gse || !v || !gv) return [];
  const cpu = (x: Timing) => (x.cpu?.user ?? 0) + (x.cpu?.sys ?? 0);
  const line = (what: string, ours: Timing, theirs: Timing, gpgName: string, target = '') =>
    `${what}: CPU ${cpu(ours).toFixed(2)} s (${mibPerSec(ours.bytes, ours.ms).toFixed(0)} MiB/s) ÷ ${gpgName} CPU ${cpu(theirs).toFixed(2)} s (${mibPerSec(theirs.bytes, theirs.ms).toFixed(0)} MiB/s) = ${(cpu(ours) / cpu(theirs)).toFixed(2)}${target}`;
  return [line('sign-and-encrypt', se, gse, 'gpg -se', ' (target ≤ 2.0)'), line('verify', v, gv, 'gpg --verify')];
}
