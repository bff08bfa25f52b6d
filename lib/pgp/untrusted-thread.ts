import { parentPort } from 'node:worker_threads';
import { serveTasks } from '../thread-pool';
import { readImportedKey, readRecipientKey } from './import';
import { readDetachedSignature, readSignerKey } from './signatures';

/**
 * The thread that reads and checks OpenPGP data a caller sends (lib/pgp/untrusted.ts): keys to import,
 * unlock and lock again, public keys to encrypt to or verify with, detached signatures. Each task answers
 * only plain data; a caller that needs the parsed key parses the checked text again (cheap: the costly
 * part, verifying self-signatures and S2K, was done here within the limits of import.ts).
 */
export const tasks = {
  importKey: (input: { data: Uint8Array; keyPassphrase?: string; secret: string; now: Date }) => readImportedKey(input.data, input),
  recipientKey: async (input: { armored: string; now: Date }) => ({ fingerprint: (await readRecipientKey(input.armored, input.now)).fingerprint }),
  signerKey: async (armored: string) => ({ fingerprint: (await readSignerKey(armored)).fingerprint }),
  detachedSignature: async (bytes: Uint8Array) => {
    await readDetachedSignature(bytes);
  },
};

if (parentPort) serveTasks(parentPort, tasks);
