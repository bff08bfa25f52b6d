import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { armorKey, armorMessage, crc24, dearmor } from '../../lib/pgp/armor';
import { createPgpHome, type PgpHome } from '../support/gpg';

let home: PgpHome;
beforeAll(async () => {
  home = await createPgpHome();
});
afterAll(async () => {
  await home?.cleanup();
});

async function collect<T extends Uint8Array>(chunks: AsyncIterable<T>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of chunks) parts.push(Buffer.from(c));
  return Buffer.concat(parts);
}

/** What gpg 2.2 reads out of armored text, and whether it complained. */
async function gpgDearmor(armored: string | Buffer): Promise<{ data: Buffer; stderr: string }> {
  const { stdout, stderr } = await home.gpg(['--dearmor', '-o', '-', await home.put(`in-${randomBytes(4).toString('hex')}.asc`, armored)]);
  return { data: stdout, stderr };
}

describe('armor', () => {
  it('computes the CRC-24 of RFC 9580 §6.1.1', () => {
    expect(crc24(Buffer.alloc(0), 0xb704ce)).toBe(0xb704ce);
    expect(crc24(Buffer.from('123456789'), 0xb704ce)).toBe(0x21cf02); // the algorithm's check value
    // Against the definition, a bit at a time, over lengths around the 8-octet steps, whole and in pieces.
    const bitwise = (bytes: Uint8Array, crc: number) => {
      for (const b of bytes) {
        crc ^= b << 16;
        for (let i = 0; i < 8; i++) crc = crc & 0x800000 ? ((crc << 1) ^ 0x1864cfb) & 0xffffff : (crc << 1) & 0xffffff;
      }
      return crc;
    };
    for (let n = 0; n < 70; n++) {
      const data = randomBytes(n);
      expect(crc24(data, 0xb704ce)).toBe(bitwise(data, 0xb704ce));
      expect(crc24(data.subarray(n >> 1), crc24(data.subarray(0, n >> 1), 0xb704ce))).toBe(bitwise(data, 0xb704ce));
    }
  });

  // gpg 2.2 read armor without a CRC line and without `=` padding (data a multiple of 3 octets) on
  // into the END line: a key block failed to import, a message came out with an invalid packet after it.
  it.each([0, 1, 2])('is read exactly by gpg with data of 3n+%i octets (messages streamed in pieces, key blocks)', async (extra) => {
    const data = randomBytes(3 * 700 + extra);
    const pieces = (async function* () {
      for (let at = 0; at < data.length; at += 333) yield data.subarray(at, at + 333);
    })();
    const message = await collect(armorMessage(pieces));
    for (const armored of [message, armorKey('PUBLIC KEY', data), armorKey('PRIVATE KEY', data)]) {
      const read = await gpgDearmor(armored);
      expect(read.stderr).toBe('');
      expect(read.data.equals(data)).toBe(true);
    }
    expect(
      (
        await collect(
          dearmor(
            (async function* () {
              yield message;
            })(),
          ),
        )
      ).equals(data),
    ).toBe(true);
  });
});
