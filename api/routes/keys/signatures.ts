import { Readable } from 'node:stream';
import { z } from 'zod';
import { route } from '../../route';
import { Fingerprint, FormBoolean } from '../../schemas/key-fields';
import { jobResponses } from '../../schemas/job-replies';
import { submitAndReply } from '../../job-reply';
import { signingTarget } from '../../../lib/keys/key-catalog';
import { requireKeyWithPassphrase } from '../../../lib/keys/passphrases';
import { keepSuppliedKey, resolveSigner } from '../../../lib/keys/signers';
import { jobBlob } from '../../../lib/jobs/job-records';
import { MAX_PUBLIC_KEY_BYTES } from '../../../lib/pgp/keys';
import type { Container } from '../../../lib/container';
import type { RequestMeta } from '../../../db/audit';
import type { KeyView } from '../../../db/keys';
import { passphraseAad } from '../../../jobs/tracked';

const tags = ['PGP keys'];

const SignForm = z.object({
  fingerprint: Fingerprint.describe("Any generation's fingerprint: the key's current generation signs"),
  passphrase: z.string().min(1).max(1024),
  detached: FormBoolean.default(true).describe('true: a detached signature per file (name.sig, or name.asc armored); false: a signed message holding the file'),
  armor: FormBoolean.default(false),
});

const VerifyForm = z
  .object({
    fingerprint: Fingerprint.optional().describe('A stored key: any of its generations may have signed'),
    public_key: z.string().max(MAX_PUBLIC_KEY_BYTES).optional().describe("The signer's armored public key"),
  })
  .refine((b) => Boolean(b.fingerprint) !== Boolean(b.public_key), { message: 'give exactly one of fingerprint and public_key', path: ['fingerprint'] });

/** The key to sign with, opened by its passphrase (the one limited, audited check), and its signing generation. */
const keyForSigning = (c: Container, userId: string, body: z.infer<typeof SignForm>, meta: RequestMeta): Promise<KeyView> =>
  requireKeyWithPassphrase(c, { userId, fingerprint: body.fingerprint, passphrase: body.passphrase, action: 'keys.sign', meta }).then((view) => {
    signingTarget(view, c.clock.now());
    return view;
  });

/**
 * What a verification needs, checked once per request (before the upload when the fields come first):
 * the signer, and each detached signature read (refused when malformed).
 */
async function verification(c: Container, userId: string, body: z.infer<typeof VerifyForm>, meta: RequestMeta, signatures: Buffer[]) {
  const signer = await resolveSigner(c, userId, { fingerprint: body.fingerprint, publicKey: body.public_key }, meta);
  for (const part of signatures) await c.untrusted.run('detachedSignature', part);
  return signer;
}

export default [
  route({
    method: 'post',
    path: '/keys/sign',
    summary: "Sign files (field `files`) with a key's current generation: detached signatures or signed messages (SHA-256 or stronger, with the signing time)",
    tags,
    access: 'auth',
    scope: 'crypto:sign',
    multipart: {
      description: 'Fields: fingerprint, passphrase, detached, armor; files',
      files: true,
      check: (body, { c, user, meta }) => keyForSigning(c, user.id, body, meta),
    },
    body: SignForm,
    responses: jobResponses,
    async handler({ c, ctx, user, body, upload, meta, checked }) {
      return submitAndReply(c, ctx, { id: upload.id, userId: user.id, kind: 'sign', requestId: meta.requestId, body, upload }, async () => {
        const view = await checked();
        return {
          request: { lineage_id: view.lineage.id, fingerprint: view.current.fingerprint, detached: body.detached, armor: body.armor },
          enqueue: (jobId) =>
            c.jobs.enqueue('sign-files', { job_id: jobId, sealed_passphrase: c.sealer.seal(body.passphrase, passphraseAad(jobId)) }, { jobId, meta }),
        };
      });
    },
  }),

  route({
    method: 'post',
    path: '/keys/verify',
    summary:
      'Verify signatures: detached ones (field `signatures`, one per file, in the order of `files`) or signed messages (no `signatures`); the result has each file’s verdict',
    tags,
    access: 'auth',
    scope: 'crypto:verify',
    multipart: {
      description: 'Fields: fingerprint or public_key (text or file), signatures (repeatable, before the files); files',
      files: true,
      textFileFields: ['public_key'],
      binaryFields: ['signatures'],
      check: (body, { c, user, meta, parts }) => verification(c, user.id, body, meta, parts.signatures ?? []),
    },
    body: VerifyForm,
    responses: jobResponses,
    async handler({ c, ctx, user, body, upload, meta, checked }) {
      const signatures = upload.parts.signatures ?? [];
      return submitAndReply(c, ctx, { id: upload.id, userId: user.id, kind: 'verify', requestId: meta.requestId, body, upload }, async () => {
        const signer = await checked();
        if (body.public_key) await keepSuppliedKey(c, upload.id, body.public_key);
        for (const [n, signature] of signatures.entries()) await c.blob.put(jobBlob.signature(upload.id, n), Readable.from([signature]));
        return { request: { signer, signatures: signatures.length }, enqueue: (jobId) => c.jobs.enqueue('verify-files', { job_id: jobId }, { jobId, meta }) };
      });
    },
  }),
];
