import { defineTrackedProcessor } from '../tracked';
import { decryptFiles, DecryptRequest } from '../../jobs/decrypt-files';
import { passphraseAad } from '../../jobs/tracked';
import type { FileSignature } from '../../jobs/verify-files';
import { invalid } from '../../lib/errors';
import { decryptionLimits, transformFiles } from '../file-pipeline';
import { unlockGeneration, unlockLineage } from '../../lib/keys/key-catalog';
import { auditInsert } from '../../db/audit';
import { outputFilesInsert } from '../../db/jobs';
import { findLineage, lineageGenerations, lineageUsableBy, recordKeyUse } from '../../db/keys';
import { requireDecryptable } from '../../lib/lifecycle/key-lifecycle';
import { verifiedKey } from '../../lib/keys/key-integrity';
import { baseFileName } from '../../lib/file-names';
import { signerKeys } from '../../lib/keys/signers';

/** `report.pdf.gpg` → `report.pdf`, when the message itself names no file. */
function plainName(stored: string, fromMessage: string): string {
  return baseFileName(fromMessage) ?? (stored.replace(/\.(gpg|pgp|asc)$/i, '') || stored);
}

/**
 * Decrypts each file with whichever generation of the lineage it was encrypted to. The plaintext goes to
 * an atomic blob put, published only if the stream ends with its integrity check passed; one failing
 * file fails the job and every output is deleted, so no partial plaintext is ever offered.
 */
export const decryptFilesProcessor = defineTrackedProcessor(decryptFiles, {
  async run(row, payload, progress, { c, origin, signal, failAs, slot }) {
    const req = DecryptRequest.parse(row.request);
    const { openEncrypted } = await import('../../lib/pgp/stream'); // the OpenPGP stack loads with a process's first crypto job
    const lineage = await findLineage(c.db, req.lineage_id);
    // Still the caller's, or still granted to it (team access revoked after submission refuses).
    if (!lineage || !(await lineageUsableBy(c.db, row.user_id, lineage.id))) throw invalid('key_not_found', 'The key no longer exists.');
    const unlock = await unlockLineage(c, lineage, c.sealer.openText(payload.sealed_passphrase, passphraseAad(row.id)));
    const generations = (await lineageGenerations(c.db, lineage.id)).map((g) => verifiedKey(c, g));
    const openedBy = new Map<number, string>(); // input n → the generation that opened it
    const verify = req.verify_with ? { keys: await signerKeys(c, row.user_id, row.id, req.verify_with), require: req.require_signature ?? false } : undefined;
    const signatures: Promise<FileSignature>[] = [];
    const limits = decryptionLimits(signal);
    failAs(limits.failAs);
    const done = await transformFiles(c, row, progress, { signal, slot }, async (source, file) => {
      const message = await openEncrypted(source, { maxDecompressedBytes: c.config.limits.maxDecompressedBytes, signal, verify });
      const key = generations.find((g) => g.encryption_key_ids.some((id) => message.encryptionKeyIds.includes(id)));
      if (!key) {
        source.destroy();
        throw invalid('no_matching_key', `"${file.name}" is not encrypted to any generation of this key.`);
      }
      try {
        requireDecryptable(lineage, key); // retired (409) or destroyed (410) generations open nothing
      } catch (err) {
        source.destroy();
        throw err;
      }
      const privateKey = await unlockGeneration(c, unlock, key);
      limits.begin();
      const plaintext = limits.decrypted(await message.decrypt(privateKey));
      openedBy.set(file.n, key.id);
      if (plaintext.signature) signatures.push(plaintext.signature.then((check) => ({ n: file.n, name: file.name, ...check })));
      return { stream: plaintext, name: plainName(file.name, plaintext.filename), contentType: 'application/octet-stream' };
    });
    return {
      result: { fingerprint: req.fingerprint, files: [], ...(verify ? { signatures: await Promise.all(signatures) } : {}) },
      progress: done.progress,
      processedBytes: done.bytesTotal,
      writes(db) {
        // Sizes are known once each input has been read (it may have arrived while the job ran).
        const used = new Map<string, { files: number; bytes: number }>();
        for (const f of done.inputs) {
          const use = used.get(openedBy.get(f.n)!) ?? { files: 0, bytes: 0 };
          used.set(openedBy.get(f.n)!, { files: use.files + 1, bytes: use.bytes + f.size });
        }
        return [
          outputFilesInsert(db, row.id, done.outputs),
          // One write per key: each updates its own row.
          ...[...used].map(([keyId, use]) => recordKeyUse(db, keyId, 'decrypt', use.files, use.bytes, c.clock.now())),
          auditInsert(
            db,
            {
              user_id: row.user_id,
              action: 'keys.decrypt',
              status: 'success',
              target: req.fingerprint,
              details: { job_id: row.id, files: done.inputs.length, bytes: done.bytesTotal },
            },
            origin,
          ),
        ];
      },
      after: done.deleteInputs,
      // Plaintext: kept for less time than ciphertext (DECRYPT_RETENTION_HOURS).
      retentionHours: c.config.decryptRetentionHours,
    };
  },
});
