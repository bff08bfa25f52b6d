import { z } from 'zod';
import { Timestamp } from './common';
import { Key } from './key-fields';

const JobFile = z
  .object({
    n: z.number().int(),
    name: z.string(),
    size: z.number().int(),
    content_type: z.string(),
    download_url: z.string().describe('GET it for the file (`/jobs/{job_id}/files/{n}`)'),
  })
  .meta({ id: 'JobFile' });

const SignatureCheck = z
  .object({
    n: z.number().int().describe('The input file it is about'),
    name: z.string(),
    valid: z.boolean(),
    signer_fingerprint: z.string().nullable().describe('The generation (its fingerprint) whose key made the signature'),
    signed_at: Timestamp.nullable(),
    reason: z
      .enum(['bad_signature', 'unknown_signer', 'signer_key_expired', 'signer_key_revoked', 'weak_hash', 'unsigned'])
      .nullable()
      .describe('Why it is not valid (null when valid)'),
  })
  .meta({ id: 'SignatureCheck' });

/** Kind-specific; every field a kind answers is named so clients read them without a hand-written type. */
const JobResult = z
  .looseObject({
    files: z.array(JobFile).optional().describe('encrypt, decrypt: the output files, once completed'),
    outputs_expired: z.boolean().optional().describe('encrypt, decrypt: true once the outputs have passed their retention and were deleted'),
    signatures: z.array(SignatureCheck).optional().describe("verify, and decrypt with verify_with: what each file's signature is, in input order"),
    key: Key.optional().describe('generate-key: the key made'),
    rotated: z.boolean().optional().describe('rotate-key: whether this job made a new generation'),
    reason: z
      .enum(['already_rotated', 'disabled', 'gone'])
      .optional()
      .describe('rotate-key, when not rotated: the key had moved on from the generation asked for, was disabled, or no longer exists'),
    rotation_id: z.uuid().optional().describe('rotate-key: its rotation history entry (GET /keys/{fingerprint}/rotation-history)'),
    old_fingerprint: z.string().optional().describe('rotate-key: the generation rotated from'),
    new_fingerprint: z.string().nullable().optional().describe('rotate-key: the generation made (now the current one)'),
    from_generation: z.number().int().optional().describe('rotate-key: the number of the generation rotated from; the new one is the next'),
  })
  .meta({ id: 'JobResult' });

export const Job = z
  .object({
    job_id: z.uuid(),
    kind: z.enum(['encrypt', 'decrypt', 'generate-key', 'rotate-key', 'rewrap', 'sign', 'verify']),
    state: z.enum(['queued', 'active', 'completed', 'failed']),
    status_url: z.string(),
    progress: z.object({
      bytes_done: z.number().optional(),
      bytes_total: z.number().optional(),
      files_done: z.number().optional(),
      files_total: z.number().optional(),
    }),
    result: JobResult.nullable().describe('When completed: kind-specific; `files` lists downloads for encrypt/decrypt'),
    error: z.object({ code: z.string(), message: z.string() }).nullable(),
    created_at: Timestamp,
    started_at: Timestamp.nullable(),
    finished_at: Timestamp.nullable(),
    expires_at: Timestamp.nullable().describe('When the outputs are deleted'),
  })
  .meta({ id: 'Job' });

export const jobResponses = {
  200: { description: 'Finished within `Prefer: wait=N`', schema: Job },
  202: { description: 'Accepted; poll `status_url` (also in Location)', schema: Job },
};
