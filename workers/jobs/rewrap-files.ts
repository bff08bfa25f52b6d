import { Readable } from 'node:stream';
import { defineTrackedProcessor } from '../tracked';
import { decryptionLimits, transformFiles } from '../file-pipeline';
import { rewrapFiles, RewrapRequest } from '../../jobs/rewrap-files';
import { passphraseAad } from '../../jobs/tracked';
import { isPqcKey, isPqcPrivateKey, readStoredKey, type StoredPrivateKey } from '../../lib/pgp/keys';
import { conflict, invalid } from '../../lib/errors';
import { keyStatus, unlockGeneration, unlockLineage } from '../../lib/keys/key-catalog';
import { requireDecryptable } from '../../lib/lifecycle/key-lifecycle';
import { verifiedKey } from '../../lib/keys/key-integrity';
import { recordAudit } from '../../db/audit';
import { insertOutputFiles } from '../../db/jobs';
import { findLineage, lineageGenerations, lineageUsableBy, recordGenerationUse, type KeyRow } from '../../db/keys';

/** `report.pdf.gpg` → `report.pdf.asc` (armored output), as encrypt names its outputs. */
function rewrappedName(input: string, armored: boolean): string {
  const base = input.replace(/\.(gpg|pgp|asc)$/i, '') || input;
  return `${base}${armored ? '.asc' : '.gpg'}`;
}

/**
 * Addresses each uploaded message to the lineage's current generation. Mode `rewrap` swaps
 * the session-key packet and copies the encrypted data byte for byte (lib/pgp/rewrap.ts); `reencrypt`
 * decrypts and encrypts again under a fresh session key, streaming. Both verify the message's integrity
 * before the output is published (atomic blob puts; one failing file fails the job and nothing is kept).
 * The generation a file needs must not be retired or destroyed (409/410), like a decrypt.
 */
export const rewrapFilesProcessor = defineTrackedProcessor(rewrapFiles, {
  async run(row, payload, progress, { c, origin, signal, failAs, slot }) {
    const req = RewrapRequest.parse(row.request);
    const limits = decryptionLimits(signal); // `reencrypt` decrypts
    failAs(limits.failAs);
    // The OpenPGP stack loads with a process's first crypto job.
    const [{ openEncrypted, encryptStream }, { openForRewrap }] = await Promise.all([import('../../lib/pgp/stream'), import('../../lib/pgp/rewrap')]);
    const lineage = await findLineage(c.db, req.lineage_id);
    if (!lineage || !(await lineageUsableBy(c.db, row.user_id, lineage.id))) throw invalid('key_not_found', 'The key no longer exists.');
    const generations = (await lineageGenerations(c.db, lineage.id)).map((g) => verifiedKey(c, g));
    const target = generations.find((g) => g.status === 'active')!;
    const status = keyStatus(lineage, target, c.clock.now());
    if (status === 'disabled') throw conflict('key_disabled', 'This key is disabled and no longer encrypts.');
    if (status === 'expired') throw conflict('key_expired', 'This key has expired and no longer encrypts; rotate it first.');
    const recipient = await readStoredKey(target.public_armored);
    // A v6 generation takes SEIPDv2 messages, whose session key packets (PKESK v6) cannot front a
    // SEIPDv1 packet: its files are encrypted again (and so move to AEAD) whichever mode was asked.
    const mode = target.profile === 'rfc4880' ? req.mode : 'reencrypt';
    const unlock = await unlockLineage(c, lineage, c.sealer.openText(payload.sealed_passphrase, passphraseAad(row.id)));
    const unlocked = new Map<string, Promise<StoredPrivateKey>>();
    const privateKeyOf = (g: KeyRow) => {
      let key = unlocked.get(g.id);
      if (!key) unlocked.set(g.id, (key = unlockGeneration(c, unlock, g)));
      return key;
    };
    const pick = (source: Readable, name: string, keyIds: string[]): KeyRow => {
      const key = generations.find((g) => g.encryption_key_ids.some((id) => keyIds.includes(id)));
      try {
        if (!key) throw invalid('no_matching_key', `"${name}" is not encrypted to any generation of this key.`);
        return requireDecryptable(lineage, key);
      } catch (err) {
        source.destroy();
        throw err;
      }
    };
    const moved: { n: number; name: string; from: KeyRow }[] = [];

    const done = await transformFiles(c, row, progress, { signal, slot }, async (input, file) => {
      let stream: Readable;
      let armored: boolean;
      let from: KeyRow;
      if (mode === 'rewrap') {
        const opened = await openForRewrap(input, { signal });
        from = pick(input, file.name, opened.encryptionKeyIds);
        armored = opened.armored;
        const oldKey = await privateKeyOf(from);
        // Post-quantum keys take and make only SEIPDv2 messages, which are encrypted again, never rewrapped.
        if (isPqcPrivateKey(oldKey) || isPqcKey(recipient)) throw invalid('unsupported_message', 'A post-quantum key takes mode "reencrypt".');
        stream = await opened.rewrap(oldKey, from.encryption_key_ids, recipient);
      } else {
        const message = await openEncrypted(input, { maxDecompressedBytes: c.config.limits.maxDecompressedBytes, signal });
        armored = message.armored;
        from = pick(input, file.name, message.encryptionKeyIds);
        const privateKey = await privateKeyOf(from);
        limits.begin();
        const plaintext = limits.decrypted(await message.decrypt(privateKey));
        // A fresh session key; the plaintext's last chunk is held back until its integrity check passed,
        // so a damaged input ends the encryption with an error and the output is never published.
        stream = await encryptStream(plaintext, recipient, { armor: armored, filename: plaintext.filename, signal });
      }
      moved.push({ n: file.n, name: file.name, from });
      return {
        stream,
        name: rewrappedName(file.name, armored),
        contentType: armored ? 'application/pgp-encrypted; charset=us-ascii' : 'application/pgp-encrypted',
      };
    });
    const files = moved.map((m) => ({
      n: m.n,
      input_name: m.name,
      from_generation: m.from.generation,
      from_fingerprint: m.from.fingerprint,
      to_generation: target.generation,
      to_fingerprint: target.fingerprint,
    }));
    return {
      result: { fingerprint: req.fingerprint, mode, fingerprint_used: target.fingerprint, rewrapped: files, files: [] },
      progress: done.progress,
      processedBytes: done.bytesTotal,
      async commit(trx) {
        const now = c.clock.now();
        await insertOutputFiles(trx, row.id, done.outputs);
        const fromCounts = new Map<string, number>();
        for (const m of moved) fromCounts.set(m.from.id, (fromCounts.get(m.from.id) ?? 0) + 1);
        for (const [keyId, n] of fromCounts) await recordGenerationUse(trx, keyId, 'rewrap_from', n, 0, now);
        await recordGenerationUse(trx, target.id, 'rewrap_to', moved.length, 0, now);
        await recordAudit(
          trx,
          {
            user_id: row.user_id,
            action: 'keys.rewrap',
            status: 'success',
            target: req.fingerprint,
            details: { job_id: row.id, mode, files: done.inputs.length, bytes: done.bytesTotal, to_generation: target.generation },
          },
          origin,
        );
      },
      after: done.deleteInputs,
    };
  },
});
