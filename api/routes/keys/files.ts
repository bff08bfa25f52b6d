import { z } from 'zod';
import { route } from '../../route';
import { Fingerprint, FormBoolean } from '../../schemas/key-fields';
import { jobResponses } from '../../schemas/job-replies';
import { submitAndReply } from '../../job-reply';
import { auditKeyRefusal, encryptionTarget, jobDeadline, requireKey, signingTarget } from '../../../lib/keys/key-catalog';
import { keepSuppliedKey, resolveSigner } from '../../../lib/keys/signers';
import { requireKeyWithPassphrase } from '../../../lib/keys/passphrases';
import type { KeyView } from '../../../db/keys';
import { AppError } from '../../../lib/errors';
import type { RequestMeta } from '../../../db/audit';
import type { Container } from '../../../lib/container';
import { passphraseAad } from '../../../jobs/tracked';
import type { EncryptRequest } from '../../../jobs/encrypt-files';
import type { Signer } from '../../../jobs/verify-files';

const tags = ['PGP keys'];

const EncryptForm = z
  .object({
    fingerprint: Fingerprint.optional(),
    public_key: z
      .string()
      .max(1 << 20)
      .optional(),
    armor: FormBoolean.default(false),
    compress: FormBoolean.default(false),
    sign_with: Fingerprint.optional().describe('Sign and encrypt: a key of yours whose current generation signs (one-pass signature inside the encryption)'),
    passphrase: z.string().min(1).max(1024).optional().describe("sign_with's passphrase"),
  })
  .refine((b) => Boolean(b.fingerprint) !== Boolean(b.public_key), { message: 'give exactly one of fingerprint and public_key', path: ['fingerprint'] })
  .refine((b) => Boolean(b.sign_with) === Boolean(b.passphrase), { message: 'sign_with and passphrase go together', path: ['sign_with'] });

const DecryptForm = z
  .object({
    fingerprint: Fingerprint,
    passphrase: z.string().min(1).max(1024),
    verify_with: Fingerprint.optional().describe('Decrypt and verify: a stored key whose generations may have signed'),
    verify_public_key: z
      .string()
      .max(1 << 20)
      .optional()
      .describe("Decrypt and verify: the signer's armored public key"),
    require_signature: FormBoolean.default(false).describe(
      'With verify_with or verify_public_key: a file without a valid signature fails (no plaintext is published)',
    ),
  })
  .refine((b) => !(b.verify_with && b.verify_public_key), { message: 'give at most one of verify_with and verify_public_key', path: ['verify_with'] })
  .refine((b) => !b.require_signature || Boolean(b.verify_with || b.verify_public_key), {
    message: 'require_signature needs verify_with or verify_public_key',
    path: ['require_signature'],
  });

/** Sign and encrypt: the signing key, opened by its passphrase (the one limited, audited check), if it may sign. */
const signerForEncryption = (c: Container, userId: string, body: z.infer<typeof EncryptForm>, meta: RequestMeta): Promise<KeyView | undefined> =>
  body.sign_with
    ? requireKeyWithPassphrase(c, { userId, fingerprint: body.sign_with, passphrase: body.passphrase!, action: 'keys.sign', meta }).then((view) => {
        signingTarget(view, c.clock.now());
        return view;
      })
    : Promise.resolve(undefined);

/** Decrypt and verify: whose signatures are checked (a stored key the caller may read, or a supplied public key). */
const signerForDecryption = (c: Container, userId: string, body: z.infer<typeof DecryptForm>, meta: RequestMeta): Promise<Signer | undefined> =>
  body.verify_with || body.verify_public_key
    ? resolveSigner(c, userId, { fingerprint: body.verify_with, publicKey: body.verify_public_key }, meta)
    : Promise.resolve(undefined);

/** What an encryption needs, looked up once per request: in the pre-upload check, else in the handler. */
async function encryptionParties(c: Container, userId: string, body: z.infer<typeof EncryptForm>, meta: RequestMeta) {
  const recipient = await recipientFor(c, userId, body, meta);
  return { recipient, signer: await signerForEncryption(c, userId, body, meta) };
}

/** What a decryption needs, looked up once per request: the key opened by its passphrase, and the signer to verify with. */
async function decryptionParties(c: Container, userId: string, body: z.infer<typeof DecryptForm>, meta: RequestMeta) {
  const view = await keyForDecryption(c, userId, body, meta);
  return { view, signer: await signerForDecryption(c, userId, body, meta) };
}

/** Where an encryption goes: a stored key's current generation (409 if it may not encrypt, audited) or a supplied public key. */
async function recipientFor(c: Container, userId: string, body: z.infer<typeof EncryptForm>, meta: RequestMeta): Promise<EncryptRequest['recipient']> {
  if (!body.fingerprint)
    return { type: 'supplied', fingerprint: (await c.untrusted.run('recipientKey', { armored: body.public_key!, now: c.clock.now() })).fingerprint };
  const view = await requireKey(c, userId, body.fingerprint, meta, 'encrypt');
  try {
    const now = c.clock.now();
    const target = encryptionTarget(view, now, jobDeadline(c, now)); // a key expiring before the job's deadline is refused up front
    return { type: 'stored', key_id: target.id, fingerprint: target.fingerprint, requested_fingerprint: view.named.fingerprint };
  } catch (err) {
    await auditKeyRefusal(c, userId, 'keys.encrypt', body.fingerprint, err instanceof AppError ? err.code : 'error', meta);
    throw err;
  }
}

/**
 * The key to decrypt with, once the passphrase has opened it (limited, audited; lib/keys/passphrases):
 * a wrong one is a clear 422 before any job, and before the upload when the fields come first.
 */
const keyForDecryption = (c: Container, userId: string, body: z.infer<typeof DecryptForm>, meta: RequestMeta): Promise<KeyView> =>
  requireKeyWithPassphrase(c, { userId, fingerprint: body.fingerprint, passphrase: body.passphrase, action: 'keys.decrypt', meta });

export default [
  route({
    method: 'post',
    path: '/keys/encrypt',
    summary: "Encrypt one or more files (field `files`, repeatable) to a stored key's fingerprint or a supplied armored public key",
    tags,
    access: 'auth',
    scope: 'crypto:encrypt',
    multipart: {
      description: 'Fields: fingerprint or public_key (text or file), armor, compress, sign_with and passphrase (sign and encrypt); files',
      files: true,
      textFileFields: ['public_key'],
      check: (body, { c, user, meta }) => encryptionParties(c, user.id, body, meta),
    },
    body: EncryptForm,
    responses: jobResponses,
    async handler({ c, ctx, user, body, upload, meta, checked }) {
      return submitAndReply(c, ctx, { id: upload.id, userId: user.id, kind: 'encrypt', requestId: meta.requestId, body, upload }, async () => {
        const { recipient, signer } = await checked();
        if (body.public_key) await keepSuppliedKey(c, upload.id, body.public_key);
        const request: EncryptRequest = {
          recipient,
          armor: body.armor,
          compress: body.compress,
          ...(signer ? { sign_with: { lineage_id: signer.lineage.id, fingerprint: signer.current.fingerprint } } : {}),
        };
        const sealed = (jobId: string) => (body.passphrase ? { sealed_passphrase: c.sealer.seal(body.passphrase, passphraseAad(jobId)) } : {});
        return { request, enqueue: (jobId) => c.jobs.enqueue('encrypt-files', { job_id: jobId, ...sealed(jobId) }, { jobId, meta }) };
      });
    },
  }),

  route({
    method: 'post',
    path: '/keys/decrypt',
    summary: 'Decrypt one or more files (field `files`) with a key fingerprint (any generation) and its passphrase',
    tags,
    access: 'auth',
    scope: 'crypto:decrypt',
    multipart: {
      description: 'Fields: fingerprint, passphrase, verify_with or verify_public_key (text or file), require_signature; files',
      files: true,
      textFileFields: ['verify_public_key'],
      check: (body, { c, user, meta }) => decryptionParties(c, user.id, body, meta),
    },
    body: DecryptForm,
    responses: jobResponses,
    async handler({ c, ctx, user, body, upload, meta, checked }) {
      return submitAndReply(c, ctx, { id: upload.id, userId: user.id, kind: 'decrypt', requestId: meta.requestId, body, upload }, async () => {
        const { view, signer } = await checked();
        if (body.verify_public_key) await keepSuppliedKey(c, upload.id, body.verify_public_key);
        return {
          request: {
            lineage_id: view.lineage.id,
            fingerprint: view.named.fingerprint,
            ...(signer ? { verify_with: signer, require_signature: body.require_signature } : {}),
          },
          enqueue: (jobId) =>
            c.jobs.enqueue('decrypt-files', { job_id: jobId, sealed_passphrase: c.sealer.seal(body.passphrase, passphraseAad(jobId)) }, { jobId, meta }),
        };
      });
    },
  }),
];
