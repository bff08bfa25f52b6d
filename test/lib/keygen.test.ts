import * as openpgp from 'openpgp';
import { describe, expect, it } from 'vitest';
import { GENERATION_S2K_COUNT_BYTE, generateKey, keygenConfig, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';

/**
 * Curve25519 keys made on Node's crypto (lib/pgp/keygen.ts) against the key OpenPGP.js makes under the
 * same settings, and OpenPGP.js as the verifier of their signatures and locks. gpg and sq read them in
 * pgp-interop.test.ts.
 */
const SECRET = 'keygen-test-secret';
const created = new Date('2026-03-04T05:06:07Z');

/** OpenPGP.js's key under keys.ts's settings, as made before keygen.ts. */
const reference = async () =>
  (
    await openpgp.generateKey({
      type: 'ecc',
      curve: 'curve25519Legacy',
      userIDs: [{ name: 'Alice', email: 'alice@example.com' }],
      passphrase: SECRET,
      keyExpirationTime: 30 * 86_400,
      date: created,
      format: 'object',
      config: { ...keygenConfig(openpgp), s2kIterationCountByte: GENERATION_S2K_COUNT_BYTE },
    })
  ).privateKey;

const ours = () => generateKey({ name: 'Alice', email: 'alice@example.com', algorithm: 'curve25519', secret: SECRET, expiresInDays: 30, date: created });

/** A signature's hashed subpackets as [type (with the critical bit), data], issuer ids and OpenPGP.js's salt notation left out. */
function hashedArea(sig: openpgp.SignaturePacket): Array<[number, string]> {
  const data = Buffer.from((sig as unknown as { signatureData: Uint8Array }).signatureData);
  const out: Array<[number, string]> = [];
  for (let at = 6; at < 6 + data.readUInt16BE(4);) {
    const length = data[at]; // every subpacket here is shorter than 192 octets
    const type = data[at + 1];
    if (![16, 20, 33].includes(type & 0x7f)) out.push([type, data.subarray(at + 2, at + 1 + length).toString('hex')]);
    at += 1 + length;
  }
  return out;
}

/** What a key packet carries besides its key material and random lock parameters. */
function shape(packet: openpgp.AnyKeyPacket) {
  const p = packet as unknown as {
    s2k: { type: string; algorithm: number; c: number };
    s2kUsage: number;
    symmetric: number;
    publicParams: { kdfParams?: { hash: number; cipher: number } };
  };
  return {
    version: packet.version,
    algorithm: packet.algorithm,
    created: packet.created.getTime(),
    oid: (packet.publicParams as { oid?: { toHex(): string } }).oid?.toHex(),
    kdf: p.publicParams.kdfParams && [p.publicParams.kdfParams.hash, p.publicParams.kdfParams.cipher],
    lock: [p.s2kUsage, p.symmetric, p.s2k.type, p.s2k.algorithm, p.s2k.c],
  };
}

describe('curve25519 keys from keygen.ts', () => {
  it('carry what OpenPGP.js puts in the same key: packets, algorithms, preferences, flags, lock', async () => {
    const [ref, gen] = await Promise.all([reference(), ours()]);
    const key = await openpgp.readPrivateKey({ armoredKey: gen.privateArmored });
    expect(key.getUserIDs()).toEqual(ref.getUserIDs());
    expect(shape(key.keyPacket)).toEqual(shape(ref.keyPacket));
    expect(key.subkeys.map((s) => shape(s.keyPacket))).toEqual(ref.subkeys.map((s) => shape(s.keyPacket)));
    const sigs = (k: openpgp.PrivateKey) => [k.users[0].selfCertifications[0], k.subkeys[0].bindingSignatures[0]];
    for (const [a, b] of sigs(key).map((s, i) => [s, sigs(ref)[i]] as const)) {
      expect([a.signatureType, a.hashAlgorithm, a.publicKeyAlgorithm]).toEqual([b.signatureType, b.hashAlgorithm, b.publicKeyAlgorithm]);
      expect(hashedArea(a)).toEqual(hashedArea(b));
      expect(a.issuerKeyID.toHex()).toBe(gen.keyId);
      expect(Buffer.from(a.issuerFingerprint!).toString('hex')).toBe(gen.fingerprint);
    }
    expect(key.getFingerprint()).toBe(gen.fingerprint);
    expect(key.subkeys.map((s) => s.getKeyID().toHex())).toEqual(gen.encryptionKeyIds);
    // The public block is the private one without its secrets.
    expect((await readStoredPublicKey(gen.publicArmored)).armor()).toBe(key.toPublic().armor());
  });

  it('have self-signatures OpenPGP.js verifies, and that fail when altered', async () => {
    const gen = await ours();
    const pub = await openpgp.readKey({ armoredKey: gen.publicArmored });
    expect((await pub.verifyAllUsers()).map((u) => u.valid)).toEqual([true]);
    await expect(pub.subkeys[0].verify(created)).resolves.toBeDefined();

    // One octet of the last signature (the subkey binding's S) changed: the subkey is no longer usable.
    const { data } = await openpgp.unarmor(gen.publicArmored);
    const bytes = Buffer.from(await new Response(data).arrayBuffer());
    bytes[bytes.length - 3] ^= 0x01;
    const tampered = await openpgp.readKey({ binaryKey: bytes });
    await expect(tampered.subkeys[0].verify(created)).rejects.toThrow();
    await expect(tampered.getEncryptionKey()).rejects.toThrow();
  });

  it('lock both secrets with the generation secret, and each matches its public key', async () => {
    const gen = await ours();
    const locked = await openpgp.readPrivateKey({ armoredKey: gen.privateArmored });
    expect(locked.getKeys().map((k) => k.isDecrypted())).toEqual([false, false]);
    const key = await unlockPrivateKey(gen.privateArmored, SECRET); // checks every secret against its public key
    expect(key.getKeys().map((k) => k.isDecrypted())).toEqual([true, true]);
    // The X25519 scalar is stored clamped (RFC 9580 §5.5.5.6.1), big-endian, as gpg and OpenPGP.js store theirs.
    const d = (key.subkeys[0].keyPacket as unknown as { privateParams: { d: Uint8Array } }).privateParams.d;
    expect([d.length, d[0] & 0xc0, d[31] & 7]).toEqual([32, 0x40, 0]);
    await expect(unlockPrivateKey(gen.privateArmored, `${SECRET}!`)).rejects.toMatchObject({ code: 'wrong_passphrase' });

    const message = await openpgp.encrypt({ message: await openpgp.createMessage({ text: 'to the new key' }), encryptionKeys: key.toPublic(), date: created });
    const { data } = await openpgp.decrypt({ message: await openpgp.readMessage({ armoredMessage: message }), decryptionKeys: key });
    expect(data).toBe('to the new key');
  });

  it('are new each time: fresh key material, salts and IVs', async () => {
    const [a, b] = await Promise.all([ours(), ours()]);
    expect(a.fingerprint).not.toBe(b.fingerprint);
    const locks = async (armored: string) =>
      (await openpgp.readPrivateKey({ armoredKey: armored })).getKeys().map((k) => {
        const p = k.keyPacket as unknown as { s2k: { salt: Uint8Array }; iv: Uint8Array };
        return Buffer.concat([p.s2k.salt, p.iv]).toString('hex');
      });
    const all = [...(await locks(a.privateArmored)), ...(await locks(b.privateArmored))];
    expect(new Set(all).size).toBe(4);
  });
});
