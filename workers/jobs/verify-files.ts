import { defineTrackedProcessor } from '../tracked';
import { verifyFiles, VerifyRequest, type FileSignature } from '../../jobs/verify-files';
import { invalid } from '../../lib/errors';
import { transformFiles } from '../file-pipeline';
import { signerKeys } from '../../lib/keys/signers';
import { jobBlob } from '../../lib/jobs/job-records';
import { readBytes } from '../../lib/streams';
import { auditInsert } from '../../db/audit';
import type { SignatureCheck } from '../../lib/pgp/verification';

/**
 * Verifies each file: against its detached signature (signature n for file n), or as a signed message.
 * A signature that does not verify is a result (`valid: false` and a reason), not a failed job; the
 * verdict of a file is known only after its last byte. No outputs.
 */
export const verifyFilesProcessor = defineTrackedProcessor(verifyFiles, {
  async run(row, _payload, progress, { c, origin, signal, slot }) {
    const req = VerifyRequest.parse(row.request);
    const { MAX_SIGNATURE_BYTES, readDetachedSignature, verifyDetached, verifySignedMessage } = await import('../../lib/pgp/signatures');
    const keys = await signerKeys(c, row.user_id, row.id, req.signer);
    const opts = { maxDecompressedBytes: c.config.limits.maxDecompressedBytes, signal };
    const checks: FileSignature[] = [];
    const done = await transformFiles(c, row, progress, { signal, slot }, async (source, file) => {
      let check: SignatureCheck;
      if (req.signatures > 0) {
        if (file.n >= req.signatures) {
          source.destroy();
          throw invalid('signature_missing', `"${file.name}" has no signature: send one signature for each file, in the same order.`);
        }
        const signature = await readDetachedSignature(await readBytes(await c.blob.get(jobBlob.signature(row.id, file.n)), MAX_SIGNATURE_BYTES));
        check = await verifyDetached(source, signature, keys, opts);
      } else {
        check = await verifySignedMessage(source, keys, opts);
      }
      checks.push({ n: file.n, name: file.name, ...check });
      return null;
    });
    if (req.signatures > 0 && done.inputs.length !== req.signatures) {
      throw invalid(
        'signature_count_mismatch',
        `${req.signatures} signatures came with ${done.inputs.length} files: send one signature for each file, in the same order.`,
      );
    }
    const valid = checks.filter((s) => s.valid).length;
    return {
      result: { signer_fingerprint: req.signer.fingerprint, valid: valid === checks.length, signatures: checks },
      progress: done.progress,
      processedBytes: done.bytesTotal,
      writes: (db) => [
        auditInsert(
          db,
          {
            user_id: row.user_id,
            action: 'keys.verify',
            status: 'success',
            target: req.signer.fingerprint,
            details: { job_id: row.id, files: checks.length, valid, signer: req.signer.type },
          },
          origin,
        ),
      ],
      events: () => [{ type: 'keys.verified', data: { job_id: row.id, fingerprint: req.signer.fingerprint, files: checks.length, valid } }],
      after: () => c.blob.deletePrefix(jobBlob.dir(row.id)).then(() => undefined),
    };
  },
});
