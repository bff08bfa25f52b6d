import { z } from 'zod';
import { recordUsage } from '../../db/billing';
import { defineTrackedJob } from '../tracked';
import { readRecipientKey, readStoredPublicKey, MAX_PUBLIC_KEY_BYTES } from '../../lib/pgp/keys';
import { readText } from '../../lib/streams';
import { transformFiles } from '../file-pipeline';
import { jobBlob } from '../../lib/services/jobs';
import { recordAudit } from '../../db/audit';
import { insertOutputFiles } from '../../db/jobs';
import { findUsableKey, recordKeyUse, type KeyRow } from '../../db/keys';
import { verifiedKey } from '../../lib/services/key-integrity';
import { openSigningKey } from '../../lib/services/keys';
import { invalid } from '../../lib/errors';
import { passphraseAad } from './decrypt-files';

/** What the API stores in the job row for an encryption (nothing secret). */
export const EncryptRequest = z.object({
  recipient: z.discriminatedUnion('type', [
    z.object({ type: z.literal('stored'), key_id: z.uuid(), fingerprint: z.string(), requested_fingerprint: z.string() }),
    z.object({ type: z.literal('supplied'), fingerprint: z.string() }),
  ]),
  armor: z.boolean(),
  compress: z.boolean(),
  /** Sign and encrypt: the key whose current generation signs (its passphrase travels sealed in the payload). */
  sign_with: z.object({ lineage_id: z.uuid(), fingerprint: z.string() }).optional(),
});
export type EncryptRequest = z.infer<typeof EncryptRequest>;

const auditTarget = (req: EncryptRequest) => req.recipient.fingerprint;

/** The name and type of the output of input `name`: known from the request, so also while it is produced. */
export const encryptedOutput = (name: string, armor: boolean) => ({
  name: `${name}${armor ? '.asc' : '.gpg'}`,
  contentType: armor ? 'application/pgp-encrypted; charset=us-ascii' : 'application/pgp-encrypted',
});

/** Streams each uploaded file blob → OpenPGP → blob; the plaintext uploads are deleted when done. */
export const encryptFiles = defineTrackedJob({
  queue: 'crypto',
  name: 'encrypt-files',
  extra: z.object({ sealed_passphrase: z.string().optional() }),
  watchProgress: true,
  async run(row, payload, progress, { c, origin, signal, slot }) {
    const req = EncryptRequest.parse(row.request);
    const { encryptStream } = await import('../../lib/pgp/stream'); // the OpenPGP stack loads with a process's first crypto job
    let key: KeyRow | undefined;
    let recipient;
    if (req.recipient.type === 'stored') {
      // The job row names the key; it must still be the caller's (or granted to it) and the one the request was answered with.
      key = await findUsableKey(c.db, row.user_id, { id: req.recipient.key_id, fingerprint: req.recipient.fingerprint });
      if (!key) throw new Error(`key ${req.recipient.key_id} of job ${row.id} is gone or not the requested one`);
      verifiedKey(c, key);
      recipient = await readStoredPublicKey(key.public_armored);
    } else {
      const armored = await readText(await c.blob.get(jobBlob.recipient(row.id)), MAX_PUBLIC_KEY_BYTES);
      recipient = (await readRecipientKey(armored, c.clock.now())).key;
    }
    let signingKey: Awaited<ReturnType<typeof openSigningKey>>['privateKey'] | undefined;
    if (req.sign_with) {
      // A job enqueued again from its row alone has no passphrase: it cannot sign.
      if (!payload.sealed_passphrase) throw invalid('job_lost', 'The signing passphrase of this job was lost; submit it again.');
      signingKey = (await openSigningKey(c, row.user_id, req.sign_with.lineage_id, c.sealer.openText(payload.sealed_passphrase, passphraseAad(row.id)))).privateKey;
    }
    const done = await transformFiles(c, row, progress, { signal, slot }, async (source, file) => ({
      stream: await encryptStream(source, recipient, { armor: req.armor, compress: req.compress, filename: file.name, signal, signingKey }),
      ...encryptedOutput(file.name, req.armor),
    }));
    return {
      result: { fingerprint_used: req.recipient.fingerprint, armor: req.armor, compressed: req.compress, ...(req.sign_with ? { signed_by: req.sign_with.fingerprint } : {}), files: [] },
      progress: done.progress,
      processedBytes: done.bytesTotal,
      writes: (db) => [
        insertOutputFiles(db, row.id, done.outputs),
        recordUsage(db, { jobId: row.id, userId: row.user_id, bytes: done.bytesTotal, at: c.clock.now() }), // billing: once per job (job id unique)
        ...(key ? [recordKeyUse(db, key.id, 'encrypt', done.inputs.length, done.bytesTotal, c.clock.now())] : []),
        recordAudit(db, { ...origin, user_id: row.user_id, action: 'keys.encrypt', status: 'success', target: auditTarget(req), details: { job_id: row.id, files: done.inputs.length, bytes: done.bytesTotal, recipient: req.recipient.type, ...(req.sign_with ? { signed_by: req.sign_with.fingerprint } : {}) } }),
      ],
      after: done.deleteInputs,
    };
  },
  async onFailure(trx, row, failure, { origin }) {
    const req = EncryptRequest.safeParse(row.request);
    await recordAudit(trx, { ...origin, user_id: row.user_id, action: 'keys.encrypt', status: 'failure', target: req.success ? auditTarget(req.data) : null, details: { job_id: row.id, code: failure.code } });
  },
});
