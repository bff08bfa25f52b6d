import { randomBytes } from 'node:crypto';
import * as openpgp from 'openpgp';
import { beforeAll, describe, expect, it } from 'vitest';
import { openSessionKeyPacket, sessionKeyPacket } from '../../lib/pgp/pkesk';

/**
 * The session key packet built on Node's X25519 (lib/pgp/pkesk.ts) against OpenPGP.js's reading of it.
 * gpg and sq read it in the interop tests (test/keys/interop.test.ts, test/lib/pgp-interop.test.ts).
 */
const user = { name: 'PKESK', email: 'pkesk@example.com' };
let curve: openpgp.PrivateKey;
let rsa: openpgp.PrivateKey;
const legacy = { type: 'ecc', curve: 'curve25519Legacy' } as const; // ECDH (18), as lib/pgp/keys.ts makes them

beforeAll(async () => {
  curve = (await openpgp.generateKey({ ...legacy, userIDs: [user], format: 'object' })).privateKey;
  rsa = (await openpgp.generateKey({ type: 'rsa', rsaBits: 2048, userIDs: [user], format: 'object' })).privateKey;
});

/** The one session key packet of `packet` (a framed packet list). */
async function pkesk(packet: Uint8Array): Promise<openpgp.PublicKeyEncryptedSessionKeyPacket> {
  const message = await openpgp.readMessage({ binaryMessage: packet });
  return message.packets.filterByTag(openpgp.enums.packet.publicKeyEncryptedSessionKey)[0] as openpgp.PublicKeyEncryptedSessionKeyPacket;
}

async function opened(packet: Uint8Array, key: openpgp.PrivateKey) {
  const message = await openpgp.readMessage({ binaryMessage: packet });
  return openpgp.decryptSessionKeys({ message, decryptionKeys: key });
}

describe('sessionKeyPacket', () => {
  it.each([
    ['aes128', 16],
    ['aes256', 32],
  ] as const)('wraps a %s session key to a Curve25519 key so that OpenPGP.js unwraps it', async (algorithm, bytes) => {
    const data = randomBytes(bytes);
    const packet = await sessionKeyPacket(curve.toPublic(), algorithm, data);
    expect(packet[0]).toBe(0xc1); // tag 1
    expect(Buffer.from(packet.subarray(3, 11)).toString('hex')).toBe((await curve.getEncryptionKey()).getKeyID().toHex());
    const [found] = await opened(packet, curve);
    expect(found).toEqual({ data: new Uint8Array(data), algorithm });
  });

  it('uses a fresh ephemeral key each time', async () => {
    const data = randomBytes(32);
    const [a, b] = await Promise.all([sessionKeyPacket(curve.toPublic(), 'aes256', data), sessionKeyPacket(curve.toPublic(), 'aes256', data)]);
    expect(Buffer.from(a).equals(Buffer.from(b))).toBe(false);
  });

  it('is refused by another key', async () => {
    const other = (await openpgp.generateKey({ ...legacy, userIDs: [user], format: 'object' })).privateKey;
    await expect(opened(await sessionKeyPacket(curve.toPublic(), 'aes256', randomBytes(32)), other)).rejects.toThrow();
  });

  it('leaves other keys to OpenPGP.js (RSA), and wraps to RFC 9580 X25519 keys (v4) here, for OpenPGP.js to open', async () => {
    const x25519 = (await openpgp.generateKey({ type: 'curve25519', userIDs: [user], format: 'object' })).privateKey;
    for (const key of [rsa, x25519]) {
      const data = randomBytes(32);
      const [found] = await opened(await sessionKeyPacket(key.toPublic(), 'aes256', data), key);
      expect(found).toEqual({ data: new Uint8Array(data), algorithm: 'aes256' });
    }
  });

  it('refuses a key that cannot encrypt (expired)', async () => {
    const { privateKey } = await openpgp.generateKey({
      ...legacy,
      userIDs: [user],
      keyExpirationTime: 1,
      date: new Date(Date.now() - 10_000),
      format: 'object',
    });
    await expect(sessionKeyPacket(privateKey.toPublic(), 'aes256', randomBytes(32))).rejects.toThrow(/expired|encryption key/i);
  });
});

describe('v6 packets to X25519 keys (RFC 9580 §5.1.6)', () => {
  let v6: openpgp.PrivateKey;
  beforeAll(async () => {
    v6 = (await openpgp.generateKey({ type: 'curve25519', userIDs: [user], format: 'object', config: { v6Keys: true, aeadProtect: true } })).privateKey;
  });

  it.each(['ocb', 'gcm'] as const)("are made here (SEIPDv2 with %s) with the subkey's version and fingerprint, and OpenPGP.js opens them", async (aead) => {
    const data = randomBytes(32);
    const packet = await sessionKeyPacket(v6.toPublic(), 'aes256', data, aead);
    const subkey = await v6.getEncryptionKey();
    expect([...packet.subarray(0, 5)]).toEqual([0xc1, packet.length - 2, 6, 33, 6]); // tag 1, length, v6, 1 + 32 octets, key v6
    expect(Buffer.from(packet.subarray(5, 37)).equals(Buffer.from(subkey.keyPacket.getFingerprintBytes()!))).toBe(true);
    expect(packet[37]).toBe(openpgp.enums.publicKey.x25519);
    const found = await pkesk(packet);
    expect((found as unknown as { version: number }).version).toBe(6);
    const [theirs] = await opened(packet, v6);
    expect(Buffer.from(theirs.data).equals(data)).toBe(true);
  });

  it('open here, made here or by OpenPGP.js, v6 and v3 alike', async () => {
    const data = randomBytes(32);
    const x25519v4 = (await openpgp.generateKey({ type: 'curve25519', userIDs: [user], format: 'object' })).privateKey;
    const cases: [openpgp.PrivateKey, Uint8Array, openpgp.enums.symmetricNames | null][] = [
      [v6, await sessionKeyPacket(v6.toPublic(), 'aes256', data, 'ocb'), null],
      [v6, await openpgp.encryptSessionKey({ data, algorithm: 'aes256', aeadAlgorithm: 'ocb', encryptionKeys: v6.toPublic(), format: 'binary' }), null],
      [x25519v4, await sessionKeyPacket(x25519v4.toPublic(), 'aes256', data), 'aes256'],
      [x25519v4, await openpgp.encryptSessionKey({ data, algorithm: 'aes256', encryptionKeys: x25519v4.toPublic(), format: 'binary' }), 'aes256'],
    ];
    for (const [key, packet, algorithm] of cases)
      expect(await openSessionKeyPacket(await pkesk(packet), key)).toEqual({ data: new Uint8Array(data), algorithm });
  });

  it('leave to OpenPGP.js what does not open here: another key, a changed octet, another fingerprint', async () => {
    const other = (await openpgp.generateKey({ type: 'curve25519', userIDs: [user], format: 'object', config: { v6Keys: true } })).privateKey;
    const packet = await sessionKeyPacket(v6.toPublic(), 'aes256', randomBytes(32), 'gcm');
    expect(await openSessionKeyPacket(await pkesk(packet), other)).toBeUndefined();
    const changed = Buffer.from(packet);
    changed[changed.length - 3] ^= 1; // inside the wrapped key
    expect(await openSessionKeyPacket(await pkesk(changed), v6)).toBeUndefined();
    await expect(opened(changed, v6)).rejects.toThrow();
    const renamed = Buffer.from(packet);
    renamed[36] ^= 1; // the fingerprint's last octet: the key id (its first 8) still names our subkey
    expect(await openSessionKeyPacket(await pkesk(renamed), v6)).toBeUndefined();
  });
});

describe('openSessionKeyPacket', () => {
  it.each(['aes128', 'aes256'] as const)('opens a %s session key wrapped here and one wrapped by OpenPGP.js', async (algorithm) => {
    const data = randomBytes(algorithm === 'aes128' ? 16 : 32);
    const ours = await sessionKeyPacket(curve.toPublic(), algorithm, data);
    const theirs = await openpgp.encryptSessionKey({ data, algorithm, encryptionKeys: curve.toPublic(), format: 'binary' });
    for (const packet of [ours, theirs]) expect(await openSessionKeyPacket(await pkesk(packet), curve)).toEqual({ data: new Uint8Array(data), algorithm });
  });

  it('leaves to OpenPGP.js what does not open here: another key, a changed octet, RSA', async () => {
    const other = (await openpgp.generateKey({ ...legacy, userIDs: [user], format: 'object' })).privateKey;
    const packet = await sessionKeyPacket(curve.toPublic(), 'aes256', randomBytes(32));
    expect(await openSessionKeyPacket(await pkesk(packet), other)).toBeUndefined();
    const changed = Buffer.from(packet);
    changed[changed.length - 3] ^= 1; // inside the wrapped key
    expect(await openSessionKeyPacket(await pkesk(changed), curve)).toBeUndefined();
    const toRsa = await sessionKeyPacket(rsa.toPublic(), 'aes256', randomBytes(32));
    expect(await openSessionKeyPacket(await pkesk(toRsa), rsa)).toBeUndefined();
  });
});
