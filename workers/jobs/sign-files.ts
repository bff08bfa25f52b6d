import { defineTrackedProcessor } from '../tracked';
import { transformFiles } from '../file-pipeline';
import { signFiles, SignRequest } from '../../jobs/sign-files';
import { passphraseAad } from '../../jobs/tracked';
import { openSigningKey } from '../../lib/keys/key-catalog';
import { auditInsert } from '../../db/audit';
import { outputFilesInsert } from '../../db/jobs';

/** The name and type of what signing input `name` makes: a detached signature or a signed message. */
const signedOutput = (name: string, req: Pick<SignRequest, 'detached' | 'armor'>) =>
  req.detached
    ? { name: `${name}${req.armor ? '.asc' : '.sig'}`, contentType: 'application/pgp-signature' }
    : { name: `${name}${req.armor ? '.asc' : '.gpg'}`, contentType: req.armor ? 'application/pgp-signature; charset=us-ascii' : 'application/octet-stream' };

/**
 * Signs each file with the lineage's current generation (at the time the job runs), one pass over the
 * data: detached signatures or signed messages. The passphrase travels sealed in the payload, for this
 * job only, as a decryption's does.
 */
export const signFilesProcessor = defineTrackedProcessor(signFiles, {
  async run(row, payload, progress, { c, origin, signal, slot }) {
    const req = SignRequest.parse(row.request);
    const { signStream } = await import('../../lib/pgp/signatures'); // the OpenPGP stack loads with a process's first crypto job
    const { lineage, current, privateKey } = await openSigningKey(
      c,
      row.user_id,
      req.lineage_id,
      c.sealer.openText(payload.sealed_passphrase, passphraseAad(row.id)),
    );
    const done = await transformFiles(c, row, progress, { signal, slot }, async (source, file) => ({
      stream: await signStream(source, privateKey, { detached: req.detached, armor: req.armor, filename: file.name, signal }),
      ...signedOutput(file.name, req),
    }));
    const facts = { lineage_id: lineage.id, fingerprint: current.fingerprint, job_id: row.id, files: done.inputs.length };
    return {
      result: { fingerprint: current.fingerprint, detached: req.detached, armor: req.armor, files: [] },
      progress: done.progress,
      processedBytes: done.bytesTotal,
      writes: (db) => [
        outputFilesInsert(db, row.id, done.outputs),
        auditInsert(
          db,
          {
            user_id: row.user_id,
            action: 'keys.sign',
            status: 'success',
            target: current.fingerprint,
            details: { job_id: row.id, files: done.inputs.length, bytes: done.bytesTotal, detached: req.detached },
          },
          origin,
        ),
      ],
      events: () => [{ type: 'keys.signed', data: facts }],
      after: done.deleteInputs,
    };
  },
});
