import * as proton from '@protontech/openpgp';
import { decrypt as bouncyCastleDecrypt } from '@renovatebot/pgp';
import * as openpgp from 'openpgp';
import { describe, expect, it } from 'vitest';
import { v6Key, type V6Profile } from '../../lib/pgp/v6/keygen';

/**
 * v6 keys made on Node's crypto (lib/pgp/v6/keygen.ts), read, unlocked and used by two independent
 * implementations: Proton's OpenPGP.js (both profiles, RFC 9580 and RFC 9980) and upstream OpenPGP.js
 * (the RFC 9580 profile; it has no post-quantum algorithms), and Bouncy Castle for the RFC 9580 profile's
 * packets (its decrypt takes an unprotected key: the lock is upstream's to check there).
 */
const SECRET = 'v6-keygen-test-secret';
/** A minute ago, in whole seconds: the keys are valid now and for 30 days. */
const created = new Date(Math.floor(Date.now() / 1000) * 1000 - 60_000);
const make = (profile: V6Profile, expiresIn = 30 * 86_400) =>
  v6Key({ profile, userId: 'Alice <alice@example.com>', secret: SECRET, s2kCountByte: 0, createdAt: created, expiresIn });

/** The typings of both libraries take Uint8Array over an ArrayBuffer, not a Buffer's pooled ArrayBufferLike. */
const bin = (b: Buffer) => new Uint8Array(b);

/** Tags and versions of a message's packets: [tag, first body octet]. */
function packetHeads(message: Uint8Array): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  const b = Buffer.from(message);
  for (let at = 0; at < b.length;) {
    const tag = b[at] & 0x3f;
    const o = b[at + 1];
    const [len, head] = o < 192 ? [o, 2] : o < 224 ? [((o - 192) << 8) + b[at + 2] + 192, 3] : o === 255 ? [b.readUInt32BE(at + 2), 6] : [Infinity, 2];
    out.push([tag, b[at + head]]);
    if (len === Infinity) break; // partial lengths: the data packet is last here
    at += head + len;
  }
  return out;
}

describe.each(['rfc9580', 'pqc'] as const)('v6 keys of the %s profile, read by Proton OpenPGP.js', (profile) => {
  it('read, unlock and validate; the fingerprint, key ids, user id and expiry are what we said', async () => {
    const key = make(profile);
    const locked = await proton.readPrivateKey({ binaryKey: bin(key.privatePackets) });
    expect(locked.keyPacket.version).toBe(6);
    expect(locked.getFingerprint()).toBe(key.fingerprint);
    expect(locked.getKeyID().toHex()).toBe(key.keyId);
    expect(locked.subkeys.map((s) => [s.getKeyID().toHex(), s.getFingerprint()])).toEqual([[key.subkeyId, key.subkeyFingerprint]]);
    expect(locked.keyPacket.algorithm).toBe(profile === 'pqc' ? 30 : 27);
    expect(locked.subkeys[0].keyPacket.algorithm).toBe(profile === 'pqc' ? 35 : 25);
    const lock = locked.keyPacket as unknown as { s2kUsage: number; symmetric: number; aead: number; s2k: { type: string; c: number } };
    expect([lock.s2kUsage, lock.symmetric, lock.aead, lock.s2k.type, lock.s2k.c]).toEqual([253, 9, 2, 'iterated', 0]);

    await expect(proton.decryptKey({ privateKey: locked, passphrase: 'wrong' })).rejects.toThrow(/passphrase/i);
    const unlocked = await proton.decryptKey({ privateKey: locked, passphrase: SECRET });
    for (const k of unlocked.getKeys()) await (k.keyPacket as unknown as { validate(): Promise<void> }).validate();
    const pub = await proton.readKey({ binaryKey: bin(key.publicPackets) });
    await pub.verifyPrimaryKey();
    expect((await pub.getPrimaryUser()).user.userID?.userID).toBe('Alice <alice@example.com>');
    expect(await pub.getExpirationTime()).toEqual(new Date(created.getTime() + 30 * 86_400_000));
    expect(pub.armor()).toBe(unlocked.toPublic().armor());
  });

  it('carry the preferences in the direct-key signature: SEIPDv1+v2, AES-256, GCM then OCB, SHA-512, no compression first', async () => {
    const pub = await proton.readKey({ binaryKey: bin(make(profile, 0).publicPackets) });
    expect(await pub.getExpirationTime()).toBe(Infinity);
    type V6Signature = proton.SignaturePacket & { salt: Uint8Array; preferredCipherSuites: number[][] };
    const direct = (pub as unknown as { directSignatures: V6Signature[] }).directSignatures[0];
    expect([direct.version, direct.signatureType, direct.hashAlgorithm, direct.salt.length]).toEqual([6, 0x1f, 10, 32]);
    expect(direct.keyFlags).toEqual([0x03]);
    expect(direct.features).toEqual([0x09]);
    expect(direct.preferredSymmetricAlgorithms).toEqual([9, 7]);
    expect(direct.preferredCipherSuites).toEqual([
      [9, 3],
      [9, 2],
    ]);
    expect(direct.preferredHashAlgorithms).toEqual([10, 14, 8, 12]);
    expect(direct.preferredCompressionAlgorithms).toEqual([0, 2]);
    expect(pub.users[0].selfCertifications[0].isPrimaryUserID).toBe(true);
    expect(pub.subkeys[0].bindingSignatures[0].keyFlags).toEqual([0x0c]);
  });

  it('are encrypted to with PKESK v6 and SEIPD v2, and decrypt it', async () => {
    const key = make(profile);
    const pub = await proton.readKey({ binaryKey: bin(key.publicPackets) });
    const unlocked = await proton.decryptKey({ privateKey: await proton.readPrivateKey({ binaryKey: bin(key.privatePackets) }), passphrase: SECRET });
    const encrypted = await proton.encrypt({ message: await proton.createMessage({ text: 'to a v6 key' }), encryptionKeys: pub, format: 'binary' });
    expect(packetHeads(encrypted)).toEqual([
      [1, 6],
      [18, 2],
    ]);
    const { data } = await proton.decrypt({ message: await proton.readMessage({ binaryMessage: encrypted }), decryptionKeys: unlocked });
    expect(data).toBe('to a v6 key');
  });

  it('sign what Proton verifies', async () => {
    const key = make(profile);
    const unlocked = await proton.decryptKey({ privateKey: await proton.readPrivateKey({ binaryKey: bin(key.privatePackets) }), passphrase: SECRET });
    const signature = await proton.sign({ message: await proton.createMessage({ text: 'signed' }), signingKeys: unlocked, detached: true, format: 'binary' });
    const { signatures } = await proton.verify({
      message: await proton.createMessage({ text: 'signed' }),
      signature: await proton.readSignature({ binarySignature: signature }),
      verificationKeys: await proton.readKey({ binaryKey: bin(key.publicPackets) }),
    });
    await expect(signatures[0].verified).resolves.toBe(true);
  });
});

describe('v6 keys read by upstream OpenPGP.js', () => {
  it('the rfc9580 profile: read, unlock, validate, encrypt to, decrypt, sign and verify', async () => {
    const key = make('rfc9580');
    const locked = await openpgp.readPrivateKey({ binaryKey: bin(key.privatePackets) });
    expect(locked.getFingerprint()).toBe(key.fingerprint);
    await expect(openpgp.decryptKey({ privateKey: locked, passphrase: 'wrong' })).rejects.toThrow(/passphrase/i);
    const unlocked = await openpgp.decryptKey({ privateKey: locked, passphrase: SECRET });
    for (const k of unlocked.getKeys()) await (k.keyPacket as openpgp.SecretKeyPacket).validate();
    const pub = await openpgp.readKey({ binaryKey: bin(key.publicPackets) });
    await pub.verifyPrimaryKey();
    expect((await pub.getEncryptionKey()).getKeyID().toHex()).toBe(key.subkeyId);

    const encrypted = await openpgp.encrypt({
      message: await openpgp.createMessage({ text: 'upstream' }),
      encryptionKeys: pub,
      signingKeys: unlocked,
      format: 'binary',
    });
    expect(packetHeads(encrypted).slice(0, 2)).toEqual([
      [1, 6],
      [18, 2],
    ]);
    const { data, signatures } = await openpgp.decrypt({
      message: await openpgp.readMessage({ binaryMessage: encrypted }),
      decryptionKeys: unlocked,
      verificationKeys: pub,
      expectSigned: true,
    });
    expect(data).toBe('upstream');
    await expect(signatures[0].verified).resolves.toBe(true);
  });

  it('the rfc9580 profile, unlocked by upstream, decrypts upstream’s SEIPDv2 in Bouncy Castle', async () => {
    const key = make('rfc9580');
    const unlocked = await openpgp.decryptKey({ privateKey: await openpgp.readPrivateKey({ binaryKey: bin(key.privatePackets) }), passphrase: SECRET });
    const encrypted = await openpgp.encrypt({
      message: await openpgp.createMessage({ text: 'to Bouncy Castle' }),
      encryptionKeys: await openpgp.readKey({ binaryKey: bin(key.publicPackets) }),
      config: { preferredAEADAlgorithm: openpgp.enums.aead.gcm },
    });
    await expect(bouncyCastleDecrypt(unlocked.armor(), encrypted, { runtime: 'wasm-java' })).resolves.toBe('to Bouncy Castle');
  });

  it('the pqc profile is beyond it (no algorithms 30 and 35): why the service reads those keys itself', async () => {
    await expect(openpgp.readKey({ binaryKey: bin(make('pqc').publicPackets) })).rejects.toThrow();
  });
});
