/**
 * Blob storage for uploads and job outputs: a local folder by default, an S3-compatible bucket when
 * several machines share work. See `BlobStore` for the contract both drivers keep.
 */
import { fileURLToPath } from 'node:url';
import { LocalBlobStore } from './local';
import type { S3Settings } from './s3';
import type { BlobStore } from './types';

export { BlobNotFoundError, type BlobStore } from './types';
export { LocalBlobStore } from './local';

export interface BlobStoreOptions {
  /** S3 settings; each one left undefined falls back to the environment. Ignored by the local driver. */
  s3?: S3Settings;
  /** The local driver's spare files (LocalBlobStoreOptions); ignored by S3. */
  spareBytes?: number;
  /** Environment for those fallbacks, default `process.env`. */
  env?: NodeJS.ProcessEnv;
}

/**
 * Open the store named by `url`:
 *   `s3://bucket[/prefix]`                → S3BlobStore
 *   `file:///abs/dir`, `/abs/dir`, `dir`  → LocalBlobStore (relative paths resolve against the cwd)
 */
export async function createBlobStore(url: string, opts: BlobStoreOptions = {}): Promise<BlobStore> {
  if (url.startsWith('s3://')) {
    const { hostname: bucket, pathname } = new URL(url);
    if (!bucket) throw new TypeError(`blob store URL has no bucket: ${url}`);
    // Loaded only when used: the AWS SDK adds about 20 MiB to every process that imports it.
    const { S3BlobStore, s3SettingsFromEnv } = await import('./s3');
    const fromEnv = s3SettingsFromEnv(opts.env);
    const settings = opts.s3 ?? {};
    const endpoint = settings.endpoint ?? fromEnv.endpoint;
    return new S3BlobStore({
      ...settings,
      bucket,
      prefix: decodeURIComponent(pathname),
      endpoint,
      region: settings.region ?? fromEnv.region,
      accessKeyId: settings.accessKeyId ?? fromEnv.accessKeyId,
      secretAccessKey: settings.secretAccessKey ?? fromEnv.secretAccessKey,
      sessionToken: settings.sessionToken ?? fromEnv.sessionToken,
      // An explicit endpoint without an explicit style means a non-AWS store: path-style.
      forcePathStyle: settings.forcePathStyle ?? (settings.endpoint !== undefined || fromEnv.forcePathStyle),
    });
  }
  if (url.startsWith('file:')) return new LocalBlobStore(fileURLToPath(url), { spareBytes: opts.spareBytes });
  // Anything else with a scheme is a typo or an unsupported store, not a folder named `http:`.
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(url)) throw new TypeError(`unsupported blob store URL: ${url}`);
  if (!url) throw new TypeError('blob store URL is empty');
  return new LocalBlobStore(url, { spareBytes: opts.spareBytes });
}
