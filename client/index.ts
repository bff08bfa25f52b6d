/**
 * The KMS client: typed calls generated from the service's OpenAPI document (`kms.api`, openapi-fetch)
 * and helpers that stream files through encryption jobs.
 *
 *   const kms = new Kms({ url: 'http://localhost:3000', token });
 *   const { outputs } = await encryptFiles(kms, { fingerprint, files: ['report.pdf'], outDir: 'out' });
 */
export { Kms, apiBase, newIdempotencyKey, CLIENT_VERSION, type KmsOptions } from './http.js';
export { ProblemError, JobFailedError, ClientError, type Problem } from './errors.js';
export {
  encryptFiles,
  decryptFiles,
  signFiles,
  verifyFiles,
  rewrap,
  rotate,
  downloadOutputs,
  refuseExistingOutputs,
  type EncryptOptions,
  type DecryptOptions,
  type SignOptions,
  type VerifyOptions,
  type RewrapOptions,
  type RotateOptions,
  type FileJobResult,
  type Output,
} from './helpers.js';
export {
  waitForJob,
  getJob,
  downloadJobFile,
  followEvents,
  submitMultipart,
  isFinished,
  type Job,
  type JobFile,
  type AccountEvent,
  type Progress,
  type Phase,
  type OnProgress,
} from './jobs.js';
export type { Upload } from './uploads.js';
export { SCOPES, type Scope } from './openapi.js';
export type { paths, components } from './openapi.js';
