import * as crypto from 'node:crypto';
import * as proton from '@protontech/openpgp';
import { describe, expect, it } from 'vitest';
import { openPqcSessionKeyPacket, pqcSessionKeyPacket } from '../../lib/pgp/v6/kem';
import { v6Key } from '../../lib/pgp/v6/keygen';
import { readV6Key, unlockV6Key } from '../../lib/pgp/v6/read-key';

/**
 * PKESK v6 to ML-KEM-768+X25519 subkeys on Node's crypto (lib/pgp/v6/kem.ts) against Proton's
 * OpenPGP.js: we open the packets Proton writes (same session key as Proton's own decryptSessionKeys),
 * and Proton decrypts messages whose session key packet we wrote in front of its SEIPDv2 packet.
 */
const SECRET = 'v6-kem-test-secret';
const createdAt = new Date(Math.floor(Date.now() / 1000) * 1000 - 60_000);
const make = () => v6Key({ profile: 'pqc', userId: 'Kem <kem@example.com>', secret: SECRET, s2kCountByte: 0, createdAt, expiresIn: 0 });
const bin = (b: Buffer) => new Uint8Array(b);

/** A binary message's packets as tag and framed bytes (new-format headers; the data packet may be partial and is taken whole as the rest). */
function packets(message: Uint8Array): Array<{ tag: number; framed: Buffer; body: Buffer }> {
  const b = Buffer.from(message);
  const out: Array<{ tag: number; framed: Buffer; body: Buffer }> = [];
  for (let at = 0; at < b.length;) {
    const o = b[at + 1];
    if (o >= 224 && o < 255) {
      out.push({ tag: b[at] & 0x3f, framed: b.subarray(at), body: Buffer.alloc(0) });
      break;
    }
    const [len, head] = o < 192 ? [o, 2] : o < 224 ? [((o - 192) << 8) + b[at + 2] + 192, 3] : [b.readUInt32BE(at + 2), 6];
    out.push({ tag: b[at] & 0x3f, framed: b.subarray(at, at + head + len), body: b.subarray(at + head, at + head + len) });
    at += head + len;
  }
  return out;
}

async function protonUnlocked(privatePackets: Buffer) {
  return proton.decryptKey({ privateKey: await proton.readPrivateKey({ binaryKey: bin(privatePackets) }), passphrase: SECRET });
}

/** Proton's SEIPDv2 of `text` under `sessionKey`, with our PKESK in front of it instead of Proton's. */
async function withOurPkesk(text: string, pub: proton.PublicKey, ours: Buffer, sessionKey: Buffer): Promise<Uint8Array<ArrayBuffer>> {
  const encrypted = await proton.encrypt({
    message: await proton.createMessage({ text }),
    encryptionKeys: pub,
    sessionKey: { data: bin(sessionKey), algorithm: 'aes256', aeadAlgorithm: 'ocb' },
    format: 'binary',
  });
  const list = packets(encrypted);
  expect(list.map((p) => [p.tag, p.body[0]])).toEqual([
    [1, 6],
    [18, 2],
  ]);
  return bin(Buffer.concat([ours, ...list.filter((p) => p.tag !== 1).map((p) => p.framed)]));
}

describe('PKESK v6 for ML-KEM-768+X25519', () => {
  it('opens what Proton wrote to our key: the session key Proton itself finds', async () => {
    const made = make();
    const theirs = await protonUnlocked(made.privatePackets);
    const encrypted = await proton.encrypt({
      message: await proton.createMessage({ text: 'from Proton' }),
      encryptionKeys: await proton.readKey({ binaryKey: bin(made.publicPackets) }),
      format: 'binary',
    });
    const [expected] = await proton.decryptSessionKeys({ message: await proton.readMessage({ binaryMessage: encrypted }), decryptionKeys: theirs });
    const pkesk = packets(encrypted).find((p) => p.tag === 1)!;
    expect(pkesk.body[0]).toBe(6);
    const opened = openPqcSessionKeyPacket(pkesk.body, unlockV6Key(made.privatePackets, SECRET));
    expect(opened && Buffer.from(opened).toString('hex')).toBe(Buffer.from(expected.data).toString('hex'));
  });

  it('writes what Proton opens: our packet in front of Proton’s SEIPDv2 decrypts, and Proton finds our session key', async () => {
    const made = make();
    const sessionKey = crypto.randomBytes(32);
    const ours = pqcSessionKeyPacket(readV6Key(made.publicPackets), sessionKey);
    const message = await withOurPkesk('to our key', await proton.readKey({ binaryKey: bin(made.publicPackets) }), ours, sessionKey);
    const theirs = await protonUnlocked(made.privatePackets);
    const [found] = await proton.decryptSessionKeys({ message: await proton.readMessage({ binaryMessage: message }), decryptionKeys: theirs });
    expect(Buffer.from(found.data).equals(sessionKey)).toBe(true);
    const { data } = await proton.decrypt({ message: await proton.readMessage({ binaryMessage: message }), decryptionKeys: theirs });
    expect(data).toBe('to our key');
    expect(openPqcSessionKeyPacket(packets(ours)[0].body, unlockV6Key(made.privatePackets, SECRET))?.equals(sessionKey)).toBe(true);
  });

  it('works with a key Proton made, both ways', async () => {
    const { privateKey, publicKey } = await proton.generateKey({
      type: 'pqc',
      userIDs: [{ name: 'P' }],
      passphrase: 'pp',
      format: 'object',
      config: { v6Keys: true, aeadProtect: true },
    });
    const sessionKey = crypto.randomBytes(32);
    const ours = pqcSessionKeyPacket(readV6Key(publicKey.write()), sessionKey);
    const message = await withOurPkesk('to Proton’s key', publicKey, ours, sessionKey);
    const unlocked = await proton.decryptKey({ privateKey, passphrase: 'pp' });
    const { data } = await proton.decrypt({ message: await proton.readMessage({ binaryMessage: message }), decryptionKeys: unlocked });
    expect(data).toBe('to Proton’s key');

    const encrypted = await proton.encrypt({ message: await proton.createMessage({ text: 'x' }), encryptionKeys: publicKey, format: 'binary' });
    const [expected] = await proton.decryptSessionKeys({ message: await proton.readMessage({ binaryMessage: encrypted }), decryptionKeys: unlocked });
    const opened = openPqcSessionKeyPacket(packets(encrypted)[0].body, unlockV6Key(privateKey.write(), 'pp'));
    expect(opened?.equals(Buffer.from(expected.data))).toBe(true);
  });

  it('opens an anonymous-recipient packet; answers undefined, never an error, for any other packet or one changed anywhere', () => {
    const made = make();
    const unlocked = unlockV6Key(made.privatePackets, SECRET);
    const sessionKey = crypto.randomBytes(32);
    const body = packets(pqcSessionKeyPacket(readV6Key(made.publicPackets), sessionKey))[0].body;
    expect(body.length).toBe(3 + 32 + 1 + 32 + 1088 + 1 + 40);
    const anonymous = Buffer.concat([Buffer.from([6, 0]), body.subarray(35)]);
    expect(openPqcSessionKeyPacket(anonymous, unlocked)?.equals(sessionKey)).toBe(true);

    const other = packets(pqcSessionKeyPacket(readV6Key(make().publicPackets), sessionKey))[0].body;
    expect(openPqcSessionKeyPacket(other, unlocked)).toBeUndefined();
    const changedAt = (at: number) => {
      const c = Buffer.from(body);
      c[at] ^= 0x10;
      return c;
    };
    // version, recipient length, fingerprint, algorithm, X25519 ciphertext, ML-KEM ciphertext, wrap length, wrapped key
    for (const at of [0, 1, 10, 35, 40, 36 + 32 + 500, 36 + 32 + 1088, body.length - 1])
      expect(openPqcSessionKeyPacket(changedAt(at), unlocked)).toBeUndefined();
    for (const cut of [0, 1, 35, 100, body.length - 1]) expect(openPqcSessionKeyPacket(body.subarray(0, cut), unlocked)).toBeUndefined();
    expect(openPqcSessionKeyPacket(Buffer.concat([body, Buffer.from([0])]), unlocked)).toBeUndefined();
    expect(
      openPqcSessionKeyPacket(
        body,
        unlockV6Key(v6Key({ profile: 'rfc9580', userId: 'x', secret: SECRET, s2kCountByte: 0, createdAt, expiresIn: 0 }).privatePackets, SECRET),
      ),
    ).toBeUndefined();
  });

  it('refuses a recipient without an ML-KEM-768+X25519 subkey in force', () => {
    const rfc9580 = v6Key({ profile: 'rfc9580', userId: 'x', secret: SECRET, s2kCountByte: 0, createdAt, expiresIn: 0 });
    expect(() => pqcSessionKeyPacket(readV6Key(rfc9580.publicPackets), crypto.randomBytes(32))).toThrow(/no ML-KEM-768\+X25519 subkey in force/);
    const expired = v6Key({
      profile: 'pqc',
      userId: 'x',
      secret: SECRET,
      s2kCountByte: 0,
      createdAt: new Date(createdAt.getTime() - 2 * 86_400_000),
      expiresIn: 86_400,
    });
    expect(() => pqcSessionKeyPacket(readV6Key(expired.publicPackets), crypto.randomBytes(32))).toThrow(/revoked or expired/);
  });
});
