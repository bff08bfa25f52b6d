/**
 * What sealing job blobs at rest costs: one file put into and read back from the local blob store, plain
 * and through the sealing decorator (lib/blob/sealed.ts: AES-256-GCM per 1 MiB chunk), in this process.
 * Interleaved plain/sealed, each after `sync`; per figure the run that used the least CPU.
 * CPU is split into user (our work: copies, AES-GCM) and system (the kernel's page cache, which on a
 * virtualised host that takes back freed memory moves by a factor of 3 between identical runs).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { LocalBlobStore, type BlobStore } from '../../lib/blob';
import { sealedJobBlobs } from '../../lib/blob/sealed';
import { jobDataKeys } from '../../lib/blob/data-keys';
import { createSealer } from '../../lib/sealer';
import type { Results, Timing } from './sections';
import { GiB, MiB, mibPerSec, timedInProcess } from './util';

export const SEALING_LABELS: Record<string, string> = {
  'sealing.put-plain': 'blob put, plain',
  'sealing.put-sealed': 'blob put, sealed',
  'sealing.get-plain': 'blob get, plain',
  'sealing.get-sealed': 'blob get, sealed',
};

const cpuOf = (t: Timing) => Object.values(t.cpu ?? {}).reduce((n, s) => n + s, 0);

/** Puts `input` (of `size` bytes) into a plain and a sealed local store under `dir` and reads it back. */
export async function measureSealing(input: string, size: number, dir: string, runs: number): Promise<Results> {
  const jobKeys = jobDataKeys(createSealer(`bench:${randomBytes(32).toString('base64')}`));
  const stores: [string, BlobStore][] = [
    ['plain', new LocalBlobStore(join(dir, 'sealing-plain'))],
    ['sealed', sealedJobBlobs(new LocalBlobStore(join(dir, 'sealing-sealed')), jobKeys)],
  ];
  const sink = () => new Writable({ write: (_chunk, _enc, done) => done() });
  const best: Results = {};
  const keep = (key: string, t: Timing) => {
    if (!best[key] || cpuOf(t) < cpuOf(best[key])) best[key] = t;
  };
  try {
    for (let i = 0; i < runs; i++) {
      for (const [name, store] of stores) {
        const job = randomUUID();
        jobKeys.mint(job);
        const key = `jobs/${job}/in/0`;
        keep(
          `sealing.put-${name}`,
          await timedInProcess(size, async () => {
            const { size: stored } = await store.put(key, createReadStream(input, { highWaterMark: MiB }));
            if (stored !== size) throw new Error(`${name} put stored ${stored} bytes of ${size}`);
          }),
        );
        keep(`sealing.get-${name}`, await timedInProcess(size, async () => pipeline(await store.get(key), sink())));
        await store.deletePrefix(key.slice(0, key.indexOf('/in/') + 1));
      }
    }
  } finally {
    await Promise.all(stores.map(([, s]) => s.close()));
  }
  return best;
}

/** `put: user 0.05 + sys 0.70 → user 0.55 + sys 0.80 CPU-s/GiB · 410 → 730 MiB/s`, plain → sealed. */
export function sealingSummary(r: Results): string[] {
  const perGiB = (t: Timing, k: string) => ((t.cpu?.[k] ?? 0) / (t.bytes / GiB)).toFixed(2);
  const cpu = (t: Timing) => `${(cpuOf(t) / (t.bytes / GiB)).toFixed(2)} (user ${perGiB(t, 'user')} + sys ${perGiB(t, 'sys')})`;
  const lines: string[] = [];
  for (const op of ['put', 'get'] as const) {
    const plain = r[`sealing.${op}-plain`];
    const sealed = r[`sealing.${op}-sealed`];
    if (!plain || !sealed) continue;
    const added = (sealed.cpu!.user - plain.cpu!.user) / (sealed.bytes / GiB);
    lines.push(
      `sealing ${op === 'put' ? 'put (seal)' : 'get (open)'}: CPU-s/GiB plain ${cpu(plain)} → sealed ${cpu(sealed)}; ` +
        `added user CPU ${added.toFixed(2)} s/GiB; MiB/s ${mibPerSec(plain.bytes, plain.ms).toFixed(0)} → ${mibPerSec(sealed.bytes, sealed.ms).toFixed(0)}`,
    );
  }
  return lines;
}
