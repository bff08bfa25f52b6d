import { createHash, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import * as proton from '@protontech/openpgp';
import { decrypt as bouncyCastleDecrypt } from '@renovatebot/pgp';
import * as openpgp from 'openpgp';
import { describe, expect, it } from 'vitest';
import { encryptStream, openEncrypted } from '../../lib/pgp/stream';

/**
 * One 64 MiB SEIPDv2 message each way, across many chunks and partial lengths: we write, Bouncy Castle
 * reads (OCB, the mode every implementation has); Proton's OpenPGP.js writes (GCM: its OCB runs in
 * JavaScript at a few MiB/s), we read. The small sizes are in seipd-v2.test.ts.
 */
const MiB = 1 << 20;
const SIZE = 64 * MiB;
const user = { name: 'V6', email: 'v6@example.test' };
const v6Key = async (aead: 'ocb' | 'gcm') =>
  (
    await openpgp.generateKey({
      type: 'curve25519',
      userIDs: [user],
      format: 'object',
      config: { v6Keys: true, aeadProtect: true, preferredAEADAlgorithm: openpgp.enums.aead[aead] },
    })
  ).privateKey;
const sha256 = (b: Uint8Array | string) => createHash('sha256').update(b).digest('hex');

/** `size` octets of base64 text in 1 MiB pieces (Bouncy Castle's wrapper answers a string). */
function* textPieces(size: number): Generator<Buffer> {
  for (let done = 0; done < size; done += MiB) yield Buffer.from(randomBytes((3 * MiB) / 4).toString('base64')).subarray(0, Math.min(MiB, size - done));
}

describe('64 MiB SEIPDv2', () => {
  it('that we write to a v6 key preferring OCB, armored, Bouncy Castle decrypts', { timeout: 240_000 }, async () => {
    const key = await v6Key('ocb');
    const pieces = [...textPieces(SIZE)];
    const armored = (await buffer(await encryptStream(Readable.from(pieces), key.toPublic(), { armor: true }))).toString();
    const plain = await bouncyCastleDecrypt(key.armor(), armored, { runtime: 'wasm-java' });
    expect(plain.length).toBe(SIZE);
    expect(sha256(plain)).toBe(sha256(Buffer.concat(pieces)));
  });

  it("that Proton's OpenPGP.js writes to a v6 key (GCM), we decrypt", { timeout: 240_000 }, async () => {
    const key = await v6Key('gcm');
    const data = randomBytes(SIZE);
    const theirKey = await proton.readKey({ armoredKey: key.toPublic().armor() });
    const message = await proton.encrypt({ message: await proton.createMessage({ binary: data }), encryptionKeys: theirKey, format: 'binary' });
    const opened = await openEncrypted(Readable.from([Buffer.from(message)]), { maxDecompressedBytes: 2 * SIZE });
    const out = await buffer(await opened.decrypt(key));
    expect(out.length).toBe(SIZE);
    expect(sha256(out)).toBe(sha256(data));
  });
});
