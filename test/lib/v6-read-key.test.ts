import * as proton from '@protontech/openpgp';
import * as openpgp from 'openpgp';
import { describe, expect, it } from 'vitest';
import { AppError } from '../../lib/errors';
import { packet } from '../../lib/pgp/packets';
import { v6Key, type V6Profile } from '../../lib/pgp/v6/keygen';
import { readV6Key, unlockV6Key } from '../../lib/pgp/v6/read-key';

/**
 * Reading v6 keys without OpenPGP.js (lib/pgp/v6/read-key.ts): ours and Proton's, both profiles; and
 * the unhappy paths: cut short, wrong lengths, other versions, tampered self-signatures, wrong secret,
 * secret material of another key, and random corruption (always a clear refusal, never a crash).
 */
const SECRET = 'v6-read-test-secret';
const created = new Date(Math.floor(Date.now() / 1000) * 1000 - 60_000);
const make = (profile: V6Profile, expiresIn = 30 * 86_400) =>
  v6Key({ profile, userId: 'Alice <alice@example.com>', secret: SECRET, s2kCountByte: 0, createdAt: created, expiresIn });

/** The refusal `fn` throws: its code and message. */
function refusal(fn: () => unknown): { code: string; message: string } {
  try {
    fn();
  } catch (err) {
    if (err instanceof AppError) return { code: err.code, message: err.message };
    throw err;
  }
  throw new Error('no refusal');
}

/** The packets of a binary key as [header, body] (new-format headers, as every key here has). */
function split(b: Buffer): Array<{ tag: number; body: Buffer }> {
  const out: Array<{ tag: number; body: Buffer }> = [];
  for (let at = 0; at < b.length;) {
    const o = b[at + 1];
    const [len, head] = o < 192 ? [o, 2] : o < 224 ? [((o - 192) << 8) + b[at + 2] + 192, 3] : [b.readUInt32BE(at + 2), 6];
    out.push({ tag: b[at] & 0x3f, body: b.subarray(at + head, at + head + len) });
    at += head + len;
  }
  return out;
}
const join = (packets: Array<{ tag: number; body: Buffer }>) => Buffer.concat(packets.map((p) => packet(p.tag, p.body)));
/** A copy of a packet's body with its last octet flipped (a signature's last octet is in its signature material). */
const flipLast = (body: Buffer) => {
  const c = Buffer.from(body);
  c[c.length - 1] ^= 0x01;
  return c;
};

describe.each(['rfc9580', 'pqc'] as const)('readV6Key on our %s keys', (profile) => {
  it('reads what keygen wrote: ids, algorithms, user id, flags, expiry, features, preferences', () => {
    const made = make(profile);
    for (const bytes of [made.publicPackets, made.privatePackets]) {
      const key = readV6Key(bytes);
      expect(key.secret).toBe(bytes === made.privatePackets);
      expect([key.fingerprint, key.keyId, key.primary.fingerprint]).toEqual([made.fingerprint, made.keyId, made.fingerprint]);
      expect(key.primary.algorithm).toBe(profile === 'pqc' ? 30 : 27);
      expect(key.subkeys.map((s) => [s.algorithm, s.keyId, s.fingerprint, s.flags, s.revoked])).toEqual([
        [profile === 'pqc' ? 35 : 25, made.subkeyId, made.subkeyFingerprint, 0x0c, false],
      ]);
      expect(key.userIds).toEqual([{ userId: 'Alice <alice@example.com>', primary: true, revoked: false }]);
      expect([key.primary.flags, key.primary.revoked, key.primary.created]).toEqual([0x03, false, created]);
      expect(key.primary.expiresAt).toEqual(new Date(created.getTime() + 30 * 86_400_000));
      expect(key.subkeys[0].expiresAt).toEqual(key.primary.expiresAt);
      expect(key.features).toBe(0x09);
      expect(key.preferences).toEqual({
        symmetric: [9, 7],
        aead: [
          [9, 3],
          [9, 2],
        ],
        hash: [10, 14, 8, 12],
        compression: [0, 2],
      });
    }
    expect(readV6Key(make(profile, 0).publicPackets).primary.expiresAt).toBeNull();
  });

  it('unlocks the secrets, each the one of its public key; a wrong secret is refused', () => {
    const made = make(profile);
    const { key, secrets } = unlockV6Key(made.privatePackets, SECRET);
    expect(key.fingerprint).toBe(made.fingerprint);
    expect(secrets.map((s) => [s.algorithm, s.fingerprint.toString('hex'), s.secretMaterial.length])).toEqual([
      [profile === 'pqc' ? 30 : 27, made.fingerprint, profile === 'pqc' ? 64 : 32],
      [profile === 'pqc' ? 35 : 25, made.subkeyFingerprint, profile === 'pqc' ? 96 : 32],
    ]);
    expect(refusal(() => unlockV6Key(made.privatePackets, 'wrong'))).toEqual({ code: 'wrong_passphrase', message: 'The key secret is wrong.' });
    expect(refusal(() => unlockV6Key(made.publicPackets, SECRET)).message).toMatch(/a public key, not a secret key/);
  });

  it('refuses secret material that is not its public key’s (an unprotected packet with another key’s secret)', () => {
    const made = make(profile);
    const other = unlockV6Key(make(profile).privatePackets, SECRET).secrets[1].secretMaterial;
    const packets = split(made.privatePackets);
    const sub = readV6Key(made.publicPackets).subkeys[0];
    const publicBody = split(made.publicPackets)[4].body;
    expect(publicBody.subarray(10).equals(sub.publicMaterial)).toBe(true);
    packets[4] = { tag: 7, body: Buffer.concat([publicBody, Buffer.from([0]), other]) };
    expect(refusal(() => unlockV6Key(join(packets), SECRET)).message).toMatch(/secret key material of [0-9a-f]{64} is not that of its public key/);
  });

  it('refuses tampered self-signatures: a subkey binding, then every primary key signature', () => {
    const made = make(profile);
    const packets = split(made.publicPackets); // key, direct-key sig, user id, certification, subkey, binding
    expect(packets.map((p) => p.tag)).toEqual([6, 2, 13, 2, 14, 2]);
    const badBinding = packets.map((p, i) => (i === 5 ? { ...p, body: flipLast(p.body) } : p));
    expect(refusal(() => readV6Key(join(badBinding))).message).toMatch(/subkey [0-9a-f]{64} has no valid binding signature/);

    // Without a valid direct-key signature the key's properties come from its user id certification (which has no preferences).
    const badDirect = packets.map((p, i) => (i === 1 ? { ...p, body: flipLast(p.body) } : p));
    expect(readV6Key(join(badDirect)).preferences.symmetric).toEqual([]);
    const badBoth = packets.map((p, i) => (i === 1 || i === 3 ? { ...p, body: flipLast(p.body) } : p));
    expect(refusal(() => readV6Key(join(badBoth))).message).toMatch(/no valid self-signature on the primary key/);

    // A changed hashed subpacket (the key flags in the direct-key signature) breaks the signature as well.
    const flags = Buffer.from(packets[1].body);
    const at = flags.indexOf(Buffer.from([0x02, 0x9b, 0x03]));
    flags[at + 2] = 0x01;
    expect(readV6Key(join(packets.map((p, i) => (i === 1 ? { ...p, body: flags } : p)))).primary.flags).toBe(0);
  });

  it('refuses keys cut short, wrong lengths, other versions and too many packets, with the reason', () => {
    const bytes = make(profile).publicPackets;
    for (const cut of [1, 2, 7, 40, bytes.length - 1]) expect(refusal(() => readV6Key(bytes.subarray(0, cut))).code).toBe('invalid_key');
    expect(refusal(() => readV6Key(bytes.subarray(0, 40))).message).toMatch(/ends too early/);
    const packets = split(bytes);
    const longer = Buffer.from(packets[0].body);
    longer.writeUInt32BE(longer.readUInt32BE(6) + 1, 6);
    expect(refusal(() => readV6Key(join([{ tag: 6, body: longer }, ...packets.slice(1)]))).message).toMatch(/key material of \d+ octets, not \d+/);
    const v5 = Buffer.from(packets[0].body);
    v5[0] = 5;
    expect(refusal(() => readV6Key(join([{ tag: 6, body: v5 }, ...packets.slice(1)]))).message).toMatch(/a version 5 key packet/);
    const sig4 = Buffer.from(packets[1].body);
    sig4[0] = 4;
    expect(refusal(() => readV6Key(join(packets.map((p, i) => (i === 1 ? { ...p, body: sig4 } : p))))).message).toMatch(/a version 4 signature/);
    const many = join([...packets, ...Array.from({ length: 30 }, () => packets[2])]);
    expect(refusal(() => readV6Key(many)).message).toMatch(/more than 32 packets/);
    expect(refusal(() => readV6Key(Buffer.from('not a key'))).message).toMatch(/not a packet header/);
  });

  it('refuses random corruption with a clear error or reads a key that is still sound, never anything else', () => {
    const bytes = make(profile).publicPackets;
    for (let i = 0; i < 300; i++) {
      const c = Buffer.from(bytes);
      const at = Math.floor(Math.random() * c.length);
      c[at] ^= 1 + Math.floor(Math.random() * 255);
      try {
        const key = readV6Key(c);
        // Octets the signatures do not cover (unhashed area lengths aside) may change; what is read still verifies.
        expect(key.fingerprint).toMatch(/^[0-9a-f]{64}$/);
      } catch (err) {
        expect(err).toBeInstanceOf(AppError);
        expect((err as AppError).code).toBe('invalid_key');
      }
    }
  });
});

describe('readV6Key on keys Proton made', () => {
  it.each([
    ['pqc', 30, 35],
    ['curve25519', 27, 25],
  ] as const)('%s: ids, algorithms, expiry, and unlocking with its passphrase (usage 253, GCM)', async (type, primaryAlg, subkeyAlg) => {
    const { privateKey, publicKey } = await proton.generateKey({
      type,
      userIDs: [{ name: 'Bob', email: 'bob@example.com' }],
      passphrase: 'bob pass',
      keyExpirationTime: 86_400,
      format: 'binary',
      config: { v6Keys: true, aeadProtect: true, s2kIterationCountByte: 96 },
    });
    const theirs = await proton.readKey({ binaryKey: publicKey });
    const key = readV6Key(publicKey);
    expect([key.fingerprint, key.keyId]).toEqual([theirs.getFingerprint(), theirs.getKeyID().toHex()]);
    expect([key.primary.algorithm, key.subkeys[0].algorithm]).toEqual([primaryAlg, subkeyAlg]);
    expect(key.subkeys[0].keyId).toBe(theirs.subkeys[0].getKeyID().toHex());
    expect(key.userIds).toEqual([{ userId: 'Bob <bob@example.com>', primary: true, revoked: false }]);
    expect(key.primary.expiresAt).toEqual(await theirs.getExpirationTime());
    expect(key.features & 0x08).toBe(0x08);
    const { secrets } = unlockV6Key(privateKey, 'bob pass');
    expect(secrets.map((s) => s.algorithm)).toEqual([primaryAlg, subkeyAlg]);
    expect(refusal(() => unlockV6Key(privateKey, 'not bob')).code).toBe('wrong_passphrase');
  });

  it('unlocks a v6 key upstream OpenPGP.js locked with S2K usage 254 (CFB, SHA-1 check)', async () => {
    const { privateKey } = await openpgp.generateKey({
      type: 'curve25519',
      userIDs: [{ name: 'Erin' }],
      passphrase: 'erin pass',
      format: 'object',
      config: { v6Keys: true, s2kIterationCountByte: 96 },
    });
    expect((privateKey.keyPacket as unknown as { s2kUsage: number }).s2kUsage).toBe(254);
    expect(unlockV6Key(privateKey.write(), 'erin pass').secrets.map((s) => s.algorithm)).toEqual([27, 25]);
    expect(refusal(() => unlockV6Key(privateKey.write(), 'not erin')).code).toBe('wrong_passphrase');
  });

  it('sees a revocation Proton made, and a v4 key is refused by its version', async () => {
    const { privateKey } = await proton.generateKey({
      type: 'pqc',
      userIDs: [{ name: 'Carol' }],
      format: 'object',
      config: { v6Keys: true, aeadProtect: true },
    });
    const { publicKey } = await proton.revokeKey({ key: privateKey, format: 'binary' });
    expect(readV6Key(publicKey).primary.revoked).toBe(true);
    const v4 = await openpgp.generateKey({ type: 'curve25519', userIDs: [{ name: 'Dave' }], format: 'binary' });
    expect(refusal(() => readV6Key(v4.publicKey)).message).toMatch(/a version 4 key packet/);
  });
});
