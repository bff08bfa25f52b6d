/**
 * Once a message's session key has been recovered, whatever a change to its encrypted data breaks (the
 * MDC, the inner packets, their lengths, the framing), the caller gets one answer: one code, one message.
 */
import { createCipheriv, createHash, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import * as openpgp from 'openpgp';
import { beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../lib/errors';
import { generateKey, readStoredPublicKey, unlockPrivateKey } from '../../lib/pgp/keys';
import { encryptStream, openEncrypted } from '../../lib/pgp/stream';
import { flipInnerTag, packetBody } from '../support/tamper';

const SECRET = 'integrity-test-secret-00';
let pub: openpgp.PublicKey;
let priv: openpgp.PrivateKey;

beforeAll(async () => {
  const key = await generateKey({ name: 'I', email: 'i@example.test', algorithm: 'curve25519', secret: SECRET });
  pub = await readStoredPublicKey(key.publicArmored);
  priv = await unlockPrivateKey(key.privateArmored, SECRET);
});

/** What decrypting `message` answers: 'ok', or the error's code and message (anything else as it is). */
async function answer(message: Buffer, key: openpgp.PrivateKey = priv): Promise<string> {
  try {
    const opened = await openEncrypted(Readable.from([message]), { maxDecompressedBytes: 1 << 20, idleMs: 5000 });
    await buffer(await opened.decrypt(key));
    return 'ok';
  } catch (err) {
    return err instanceof AppError ? `${err.code}: ${err.message}` : `not ours: ${String(err)}`;
  }
}

/** A SEIPDv1 message whose decrypted contents are `inner` followed by `mdc` (the honest MDC packet by default); a password packet beside ours if asked. */
async function sealed(inner: Buffer, opts: { passwords?: string[]; mdc?: (honest: Buffer) => Buffer } = {}): Promise<Buffer> {
  const sessionKey = randomBytes(32);
  const pkesk = await openpgp.encryptSessionKey({ data: sessionKey, algorithm: 'aes256', encryptionKeys: pub, passwords: opts.passwords, format: 'binary' });
  const prefix = randomBytes(16);
  const hashed = Buffer.concat([prefix, prefix.subarray(14), inner, Buffer.from([0xd3, 0x14])]);
  const honest = Buffer.concat([hashed, createHash('sha1').update(hashed).digest()]);
  const plain = opts.mdc ? Buffer.concat([prefix, prefix.subarray(14), inner, opts.mdc(honest.subarray(-22))]) : honest;
  const cipher = createCipheriv('aes-256-cfb', sessionKey, Buffer.alloc(16));
  const body = Buffer.concat([Buffer.from([1]), cipher.update(plain), cipher.final()]);
  const length = Buffer.alloc(5);
  length[0] = 0xff;
  length.writeUInt32BE(body.length, 1);
  return Buffer.concat([Buffer.from(pkesk), Buffer.from([0xd2]), length, body]);
}

/** A literal data packet (binary, no name, a five-octet length). */
function literal(data: Buffer): Buffer {
  const head = Buffer.from([0xcb, 0xff, 0, 0, 0, 0, 0x62, 0, 0, 0, 0, 0]);
  head.writeUInt32BE(data.length + 6, 2);
  return Buffer.concat([head, data]);
}

/** Every single-bit and whole-octet change, and every cut, of the encrypted data (after `head`: its version octet, and for SEIPDv2 its parameters and salt). */
function* tampered(message: Buffer, head: number): Generator<[string, Buffer]> {
  const start = packetBody(message, 18) + head;
  for (let at = start; at < message.length; at++) {
    for (const mask of [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xff]) {
      const bad = Buffer.from(message);
      bad[at] ^= mask;
      yield [`octet ${at} ^ ${mask}`, bad];
    }
    yield [`cut at ${at}`, message.subarray(0, at)];
  }
}

async function sweep(message: Buffer, head = 1, key = priv): Promise<Map<string, string[]>> {
  expect(await answer(message, key)).toBe('ok');
  const seen = new Map<string, string[]>();
  for (const [what, bad] of tampered(message, head)) {
    const got = await answer(bad, key);
    seen.set(got, [...(seen.get(got) ?? []), what]);
  }
  return seen;
}

const ONE = /^integrity_check_failed: /;

describe('every failure after decryption has begun answers alike', () => {
  it('SEIPDv1: a sweep of changes across the whole encrypted data finds one code and one message', { timeout: 120_000 }, async () => {
    const message = await buffer(await encryptStream(Readable.from([randomBytes(40)]), pub, { armor: false }));
    const seen = await sweep(message);
    expect([...seen.keys()], JSON.stringify([...seen].map(([k, v]) => [k, v.slice(0, 3)]))).toHaveLength(1);
    expect([...seen.keys()][0]).toMatch(ONE);
  });

  it.each(['ocb', 'gcm'] as const)('SEIPDv2 (%s, 64-octet chunks): the same sweep finds the same one answer', { timeout: 120_000 }, async (aead) => {
    const data = randomBytes(100);
    const sessionKey = { data: randomBytes(32), algorithm: 'aes256' as const, aeadAlgorithm: aead };
    const message = Buffer.from(
      await openpgp.encrypt({
        message: await openpgp.createMessage({ binary: data }),
        encryptionKeys: pub,
        sessionKey,
        format: 'binary',
        config: { aeadChunkSizeByte: 0 },
      }),
    );
    const seen = await sweep(message, 4 + 32);
    expect([...seen.keys()], JSON.stringify([...seen].map(([k, v]) => [k, v.slice(0, 3)]))).toHaveLength(1);
    const v1 = await buffer(await encryptStream(Readable.from([data]), pub, { armor: false }));
    expect([...seen.keys()][0]).toBe(await answer(flipInnerTag(v1)));
  });

  it.each(['ocb', 'gcm'] as const)('SEIPDv2 (%s) as we write it to a v6 key: the same sweep finds the same one answer', { timeout: 120_000 }, async (aead) => {
    const { privateKey } = await openpgp.generateKey({
      type: 'curve25519',
      userIDs: [{ name: 'I6', email: 'i6@example.test' }],
      format: 'object',
      config: { v6Keys: true, aeadProtect: true, preferredAEADAlgorithm: openpgp.enums.aead[aead] },
    });
    const data = randomBytes(100);
    const message = await buffer(await encryptStream(Readable.from([data]), privateKey.toPublic(), { armor: false }));
    expect(message[packetBody(message, 18) + 2]).toBe(openpgp.enums.aead[aead]);
    const seen = await sweep(message, 4 + 32, privateKey);
    expect([...seen.keys()], JSON.stringify([...seen].map(([k, v]) => [k, v.slice(0, 3)]))).toHaveLength(1);
    const v1 = await buffer(await encryptStream(Readable.from([data]), pub, { armor: false }));
    expect([...seen.keys()][0]).toBe(await answer(flipInnerTag(v1)));
  });

  it('a wrong MDC, a missing MDC, a broken inner tag or length and an unexpected inner packet answer alike, with or without a password packet beside ours', async () => {
    const data = randomBytes(600);
    const answers = new Set<string>();
    for (const passwords of [undefined, ['pw']]) {
      const honest = await sealed(literal(data), { passwords });
      expect(await answer(honest)).toBe('ok');
      answers.add(await answer(flipInnerTag(honest))); // the inner packet reads as encrypted data
      answers.add(await answer(await sealed(literal(data), { passwords, mdc: (mdc) => Buffer.concat([mdc.subarray(0, 21), Buffer.from([mdc[21] ^ 1])]) })));
      answers.add(await answer(await sealed(literal(data), { passwords, mdc: () => Buffer.alloc(0) }))); // no MDC packet
      answers.add(await answer(await sealed(Buffer.concat([Buffer.from([0xcb, 0xe4]), literal(data).subarray(6)]), { passwords }))); // a 16-octet partial length
      answers.add(await answer(await sealed(Buffer.concat([Buffer.from([0xd2, 5, 1, 2, 3, 4, 5]), literal(data)]), { passwords }))); // encrypted data inside
      answers.add(await answer(await sealed(Buffer.from([0xc8, 3, 1, 0xff, 0xff]), { passwords }))); // broken zlib data
      answers.add(await answer(await sealed(literal(data).subarray(0, 300), { passwords }))); // a literal packet cut short
    }
    expect([...answers]).toHaveLength(1);
    expect([...answers][0]).toMatch(ONE);
  });

  it('failures before decryption stay distinct: no session key for this key, not a message', async () => {
    const other = await generateKey({ name: 'O', email: 'o@example.test', algorithm: 'curve25519', secret: SECRET });
    const toOther = await buffer(await encryptStream(Readable.from([randomBytes(40)]), await readStoredPublicKey(other.publicArmored), { armor: false }));
    expect(await answer(toOther)).toMatch(/^no_matching_key: /);
    expect(await answer(Buffer.from('hello'))).toMatch(/^malformed_message: /);
  });
});
