import { recordUsage } from '../../db/billing';
import { defineTrackedProcessor } from '../tracked';
import { encryptedOutput, encryptFiles, EncryptRequest } from '../../jobs/encrypt-files';
import { passphraseAad } from '../../jobs/tracked';
import { readStoredKey, MAX_PUBLIC_KEY_BYTES } from '../../lib/pgp/keys';
import { readText } from '../../lib/streams';
import { transformFiles } from '../file-pipeline';
import { jobBlob } from '../../lib/jobs/job-records';
import { auditInsert } from '../../db/audit';
import { outputFilesInsert } from '../../db/jobs';
import { findUsableKey, recordKeyUse, type KeyRow } from '../../db/keys';
import { verifiedKey } from '../../lib/keys/key-integrity';
import { openSigningKey } from '../../lib/keys/key-catalog';
import { invalid } from '../../lib/errors';

const auditTarget = (req: EncryptRequest) => req.recipient.fingerprint;

/** Streams each uploaded file blob → OpenPGP → blob; the plaintext uploads are deleted when done. */
export const encryptFilesProcessor = defineTrackedProcessor(encryptFiles, {
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
      recipient = await readStoredKey(key.public_armored);
    } else {
      // Checked again now (it may have expired since the request) on the untrusted-work thread, then parsed here.
      const armored = await readText(await c.blob.get(jobBlob.recipient(row.id)), MAX_PUBLIC_KEY_BYTES);
      await c.untrusted.run('recipientKey', { armored, now: c.clock.now() });
      recipient = await readStoredKey(armored);
    }
    let signingKey: Awaited<ReturnType<typeof openSigningKey>>['privateKey'] | undefined;
    if (req.sign_with) {
      // A job enqueued again from its row alone has no passphrase: it cannot sign.
      if (!payload.sealed_passphrase) throw invalid('job_lost', 'The signing passphrase of this job was lost; submit it again.');
      signingKey = (await openSigningKey(c, row.user_id, req.sign_with.lineage_id, c.sealer.openText(payload.sealed_passphrase, passphraseAad(row.id))))
        .privateKey;
    }
    const done = await transformFiles(c, row, progress, { signal, slot }, async (source, file) => ({
      stream: await encryptStream(source, recipient, { armor: req.armor, compress: req.compress, filename: file.name, signal, signingKey }),
      ...encryptedOutput(file.name, req.armor),
    }));
    return {
      result: {
        fingerprint_used: req.recipient.fingerprint,
        armor: req.armor,
        compressed: req.compress,
        ...(req.sign_with ? { signed_by: req.sign_with.fingerprint } : {}),
        files: [],
      },
      progress: done.progress,
      processedBytes: done.bytesTotal,
      writes: (db) => [
        outputFilesInsert(db, row.id, done.outputs),
        recordUsage(db, { jobId: row.id, userId: row.user_id, bytes: done.bytesTotal, at: c.clock.now() }), // billing: once per job (job id unique)
        ...(key ? [recordKeyUse(db, key.id, 'encrypt', done.inputs.length, done.bytesTotal, c.clock.now())] : []),
        auditInsert(
          db,
          {
            user_id: row.user_id,
            action: 'keys.encrypt',
            status: 'success',
            target: auditTarget(req),
            details: {
              job_id: row.id,
              files: done.inputs.length,
              bytes: done.bytesTotal,
              recipient: req.recipient.type,
              ...(req.sign_with ? { signed_by: req.sign_with.fingerprint } : {}),
            },
          },
          origin,
        ),
      ],
      after: done.deleteInputs,
    };
  },
});
