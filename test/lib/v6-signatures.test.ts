import * as crypto from 'node:crypto';
import * as proton from '@protontech/openpgp';
import * as openpgp from 'openpgp';
import { describe, expect, it } from 'vitest';
import { signDetachedV6, verifyDetachedV6 } from '../../lib/pgp/v6/detached';
import { v6Key, type V6Profile } from '../../lib/pgp/v6/keygen';
import { readV6Key, unlockV6Key } from '../../lib/pgp/v6/read-key';

/**
 * Detached v6 signatures on Node's crypto (lib/pgp/v6/detached.ts), ML-DSA-65+Ed25519 and Ed25519,
 * against Proton's OpenPGP.js both ways (and upstream OpenPGP.js for Ed25519).
 */
const SECRET = 'v6-signature-test-secret';
const now = Math.floor(Date.now() / 1000) * 1000;
const make = (profile: V6Profile, createdAt = new Date(now - 60_000), expiresIn = 0) =>
  v6Key({ profile, userId: 'Signer <signer@example.com>', secret: SECRET, s2kCountByte: 0, createdAt, expiresIn });
const bin = (b: Buffer) => new Uint8Array(b);
const data = crypto.randomBytes(200_000);
async function* inChunks(b: Buffer, size = 65_536) {
  for (let at = 0; at < b.length; at += size) yield b.subarray(at, at + size);
}

describe.each(['rfc9580', 'pqc'] as const)('detached v6 signatures, %s profile', (profile) => {
  it('ours, over a buffer or a stream of chunks, verify in Proton and here', async () => {
    const made = make(profile);
    const unlocked = unlockV6Key(made.privatePackets, SECRET);
    for (const signature of [await signDetachedV6(unlocked, data), await signDetachedV6(unlocked, inChunks(data))]) {
      const { signatures } = await proton.verify({
        message: await proton.createMessage({ binary: bin(data) }),
        signature: await proton.readSignature({ binarySignature: bin(signature) }),
        verificationKeys: await proton.readKey({ binaryKey: bin(made.publicPackets) }),
      });
      await expect(signatures[0].verified).resolves.toBe(true);
      expect(signatures[0].keyID.toHex()).toBe(made.keyId);
      const ours = await verifyDetachedV6(signature, inChunks(data, 1000), readV6Key(made.publicPackets));
      expect(ours).toMatchObject({ valid: true, signingKeyId: made.keyId, signingFingerprint: made.fingerprint, reason: null });
      expect(ours.created!.getTime()).toBeGreaterThanOrEqual(now - 1000);
    }
  });

  it('Proton’s with our key verify here', async () => {
    const made = make(profile);
    const theirs = await proton.decryptKey({ privateKey: await proton.readPrivateKey({ binaryKey: bin(made.privatePackets) }), passphrase: SECRET });
    const signature = await proton.sign({ message: await proton.createMessage({ binary: bin(data) }), signingKeys: theirs, detached: true, format: 'binary' });
    expect(await verifyDetachedV6(signature, data, readV6Key(made.publicPackets))).toMatchObject({ valid: true, signingKeyId: made.keyId });
  });

  it('refuse changed data, another key, a changed signature; report an expired signer', async () => {
    const made = make(profile);
    const key = readV6Key(made.publicPackets);
    const signature = await signDetachedV6(unlockV6Key(made.privatePackets, SECRET), data);
    const changed = Buffer.from(data);
    changed[12345] ^= 1;
    expect(await verifyDetachedV6(signature, changed, key)).toMatchObject({ valid: false, reason: 'bad_signature', signingKeyId: made.keyId });
    expect(await verifyDetachedV6(signature, data, readV6Key(make(profile).publicPackets))).toMatchObject({
      valid: false,
      reason: 'unknown_signer',
      signingKeyId: null,
    });
    // In the hashed area, in the signature material: each fails; a change to the framing is a malformed signature.
    for (const at of [8, 20, signature.length - 10, signature.length - 1]) {
      const bad = Buffer.from(signature);
      bad[at] ^= 0x40;
      const verdict = await verifyDetachedV6(bad, data, key).catch((err: { code?: string }) => err.code);
      expect(verdict === 'malformed_signature' || (typeof verdict === 'object' && !verdict.valid)).toBe(true);
    }
    await expect(verifyDetachedV6(signature.subarray(0, 50), data, key)).rejects.toThrow(/A signature cannot be read: it ends too early/);

    const old = make(profile, new Date(now - 2 * 86_400_000), 86_400);
    const late = await signDetachedV6(unlockV6Key(old.privatePackets, SECRET), data);
    expect(await verifyDetachedV6(late, data, readV6Key(old.publicPackets))).toMatchObject({ valid: false, reason: 'signer_key_expired' });
  });
});

describe('detached v6 signatures across implementations', () => {
  it('a signature by a key Proton made (ML-DSA-65+Ed25519) verifies here', async () => {
    const { privateKey, publicKey } = await proton.generateKey({ type: 'pqc', userIDs: [{ name: 'Proton' }], format: 'object', config: { v6Keys: true } });
    const signature = await proton.sign({
      message: await proton.createMessage({ binary: bin(data) }),
      signingKeys: privateKey,
      detached: true,
      format: 'binary',
    });
    const check = await verifyDetachedV6(signature, inChunks(data), readV6Key(publicKey.write()));
    expect(check).toMatchObject({ valid: true, signingFingerprint: publicKey.getFingerprint(), reason: null });
  });

  it('upstream OpenPGP.js verifies ours (Ed25519) and we verify its own', async () => {
    const made = make('rfc9580');
    const signature = await signDetachedV6(unlockV6Key(made.privatePackets, SECRET), data);
    const { signatures } = await openpgp.verify({
      message: await openpgp.createMessage({ binary: bin(data) }),
      signature: await openpgp.readSignature({ binarySignature: bin(signature) }),
      verificationKeys: await openpgp.readKey({ binaryKey: bin(made.publicPackets) }),
    });
    await expect(signatures[0].verified).resolves.toBe(true);

    const { privateKey, publicKey } = await openpgp.generateKey({
      type: 'curve25519',
      userIDs: [{ name: 'Upstream' }],
      format: 'object',
      config: { v6Keys: true },
    });
    const theirs = await openpgp.sign({
      message: await openpgp.createMessage({ binary: bin(data) }),
      signingKeys: privateKey,
      detached: true,
      format: 'binary',
    });
    expect(await verifyDetachedV6(theirs, data, readV6Key(publicKey.write()))).toMatchObject({ valid: true, signingKeyId: publicKey.getKeyID().toHex() });
  });
});
