/**
 * Per-job data keys: lib/blob/sealed.ts seals everything under `jobs/<id>/` with its job's key. A key is
 * 32 random bytes made with its job (`mint`, when the API starts receiving the job's files) and kept in
 * the job's row (`jobs.data_key`), sealed under the master key with `job-data-key:<id>` as AAD. Keeping it
 * in the row rather than beside the blobs saves each job a file to create, and a worker a file to read:
 * it hands over the key of the row it has read anyway (`admit`).
 *
 * Jobs written before migration 017 keep theirs beside their blobs as `jobs/<id>/key`, which is still read
 * (a reserved name: sealed.ts refuses it to callers). Workers of this version read both, so during an
 * upgrade they go first; the API of the previous version keeps writing key files meanwhile.
 */
import { randomBytes } from 'node:crypto';
import { LruCache } from '../lru';
import type { Sealer } from '../sealer';
import { readText } from '../streams';
import { type BlobStore, BlobNotFoundError } from './types';

/** Name of a legacy data key inside a job's folder. */
export const KEY_NAME = 'key';
const KEY_BLOB_MAX_BYTES = 4096;
const CACHE_SIZE = 256;
const CACHE_MS = 5 * 60_000;

export const dataKeyAad = (jobId: string) => `job-data-key:${jobId}`;

export interface JobDataKeys {
  /**
   * A new data key for job `jobId`, sealed for its row. It is held in memory until `release`: the job's
   * first blobs may be written before its row (a supplied public key) or without one (a replayed request).
   */
  mint(jobId: string): string;
  /** The job's files have been received: its key may leave memory (its row has it). */
  release(jobId: string): void;
  /** The sealed key of a job row already read, so that its blobs need no lookup (null: a job from before 017). */
  admit(jobId: string, sealed: string | null): void;
  /** The job's key: held in memory, else from its row, else from a legacy key file; throws when it has none. */
  get(jobId: string): Promise<Buffer>;
  /** The job's blobs are gone: its key leaves this process's memory now rather than at the cache's age limit. */
  forget(jobId: string): void;
}

/**
 * `lookup` reads a job's sealed key from its row (undefined or null when there is none); `legacy` is the
 * unsealed store holding `jobs/<id>/key` files. Tests and benches without a database pass neither.
 */
export function jobDataKeys(sealer: Sealer, sources: { lookup?(jobId: string): Promise<string | null | undefined>; legacy?: BlobStore } = {}): JobDataKeys {
  /** Minted keys whose uploads still run: never evicted. */
  const minted = new Map<string, Buffer>();
  const cache = new LruCache<string, Buffer>({ max: CACHE_SIZE, ttlMs: CACHE_MS });
  /** Lookups in progress, so that concurrent reads of one job look it up once. */
  const pending = new Map<string, Promise<Buffer>>();

  function open(jobId: string, sealed: string): Buffer {
    const key = sealer.open(sealed, dataKeyAad(jobId));
    if (key.length !== 32) throw new Error(`data key of job ${jobId} has ${key.length} bytes`);
    return key;
  }

  async function load(jobId: string): Promise<Buffer> {
    let sealed = await sources.lookup?.(jobId);
    if (!sealed && sources.legacy) {
      try {
        sealed = await readText(await sources.legacy.get(`jobs/${jobId}/${KEY_NAME}`), KEY_BLOB_MAX_BYTES);
      } catch (err) {
        if (!(err instanceof BlobNotFoundError)) throw err;
      }
    }
    if (!sealed) throw new Error(`job ${jobId} has no data key: its blobs cannot be read or written`);
    return cache.set(jobId, open(jobId, sealed));
  }

  return {
    mint(jobId) {
      const key = randomBytes(32);
      minted.set(jobId, key);
      return sealer.seal(key, dataKeyAad(jobId));
    },
    release(jobId) {
      const key = minted.get(jobId);
      if (!key) return;
      minted.delete(jobId);
      cache.set(jobId, key);
    },
    admit(jobId, sealed) {
      if (sealed && !minted.has(jobId) && !cache.get(jobId)) cache.set(jobId, open(jobId, sealed));
    },
    get(jobId) {
      const known = minted.get(jobId) ?? cache.get(jobId);
      if (known) return Promise.resolve(known);
      let p = pending.get(jobId);
      if (!p) {
        p = load(jobId).finally(() => pending.delete(jobId));
        pending.set(jobId, p);
      }
      return p;
    },
    forget(jobId) {
      minted.delete(jobId);
      cache.delete(jobId);
    },
  };
}
