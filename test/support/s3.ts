import { join } from 'node:path';
// @ts-expect-error -- s3rver ships no type declarations
import S3rverModule from 's3rver';
import './atomic-s3rver.mjs';

interface S3rverOptions {
  address: string;
  port: number;
  silent: boolean;
  directory: string;
  configureBuckets: { name: string }[];
}
export const S3rver = S3rverModule as new (opts: S3rverOptions) => { run(): Promise<{ port: number }>; close(): Promise<void> };

/** A real S3-compatible server (s3rver) on loopback with one bucket; credentials S3RVER/S3RVER. */
export async function startS3(dir: string, bucket = 'kms-blobs') {
  const server = new S3rver({ address: '127.0.0.1', port: 0, silent: true, directory: join(dir, 's3rver'), configureBuckets: [{ name: bucket }] });
  const { port } = await server.run();
  return {
    endpoint: `http://127.0.0.1:${port}`,
    env: { BLOB_STORE_URL: `s3://${bucket}/kms`, S3_ENDPOINT: `http://127.0.0.1:${port}`, AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER' },
    close: () => server.close(),
  };
}
