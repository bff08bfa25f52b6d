import { Readable } from 'node:stream';
import type { Container } from '../container';
import { invalid } from '../errors';
import { requireKey } from './key-catalog';
import { verifiedKey } from './key-integrity';
import { jobBlob } from '../jobs/job-records';
import { readText } from '../streams';
import { MAX_PUBLIC_KEY_BYTES, readStoredKey } from '../pgp/keys';
import type { VerificationKey } from '../pgp/verification';
import { lineageGenerations, lineageUsableBy } from '../../db/keys';
import type { RequestMeta } from '../../db/audit';
import type { Signer } from '../../jobs/verify-files';

/**
 * The signer a request names: a key the caller may read (404 otherwise, through requireKey), or a
 * supplied public key, read under the import's limits (its job keeps it: keepSuppliedKey).
 */
export async function resolveSigner(c: Container, userId: string, input: { fingerprint?: string; publicKey?: string }, meta: RequestMeta): Promise<Signer> {
  if (input.fingerprint) {
    const view = await requireKey(c, userId, input.fingerprint, meta, 'read');
    return { type: 'stored', lineage_id: view.lineage.id, fingerprint: view.named.fingerprint };
  }
  const key = await c.untrusted.run('signerKey', input.publicKey ?? '');
  return { type: 'supplied', fingerprint: key.fingerprint };
}

/** A public key sent with a request (a recipient or a signer), kept with job `jobId`'s files for its worker. */
export async function keepSuppliedKey(c: Container, jobId: string, publicKey: string): Promise<void> {
  await c.blob.put(jobBlob.recipient(jobId), Readable.from([Buffer.from(publicKey)]));
}

/** The keys a job verifies with (in a worker): the lineage's generations, MAC-checked, or the supplied key. */
export async function signerKeys(c: Container, userId: string, jobId: string, signer: Signer): Promise<VerificationKey[]> {
  if (signer.type === 'supplied') {
    // Checked on the untrusted-work thread; parsed here again for the verification (cheap once checked).
    const armored = await readText(await c.blob.get(jobBlob.recipient(jobId)), MAX_PUBLIC_KEY_BYTES);
    const { fingerprint } = await c.untrusted.run('signerKey', armored);
    return [{ key: await readStoredKey(armored), fingerprint }];
  }
  // Still the caller's, or still granted to it.
  if (!(await lineageUsableBy(c.db, userId, signer.lineage_id))) throw invalid('key_not_found', 'The key no longer exists.');
  const generations = (await lineageGenerations(c.db, signer.lineage_id)).map((g) => verifiedKey(c, g));
  return Promise.all(generations.map(async (g) => ({ key: await readStoredKey(g.public_armored), fingerprint: g.fingerprint })));
}
