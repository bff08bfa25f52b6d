/**
 * ASCII armor (RFC 9580 §6.2), 64 characters a line, with the CRC24 line: RFC 9580 §6.1 says not to
 * emit it unless a peer needs it, and gpg 2.2 does. Without it, armor whose data is a multiple of 3
 * octets (no `=` padding) is read on into the END line: gpg then refuses a key block ("no valid
 * OpenPGP data found") and decrypts a message with an "invalid packet" error after it.
 */

/** A message's armor, streamed from its binary chunks. */
export async function* armorMessage(chunks: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
  yield Buffer.from('-----BEGIN PGP MESSAGE-----\n\n');
  let crc = CRC24_INIT;
  let carry = Buffer.alloc(0);
  for await (const chunk of chunks) {
    crc = crc24(chunk, crc);
    const all = carry.length ? Buffer.concat([carry, chunk]) : chunk;
    const whole = all.length - (all.length % 48);
    if (whole) yield Buffer.from(lines(all.subarray(0, whole)));
    carry = Buffer.from(all.subarray(whole));
  }
  yield Buffer.from(`${lines(carry)}${checksumLine(crc)}-----END PGP MESSAGE-----\n`);
}

/** A key block's armor. */
export const armorKey = (kind: 'PUBLIC KEY' | 'PRIVATE KEY', packets: Buffer): string =>
  `-----BEGIN PGP ${kind} BLOCK-----\n\n${lines(packets)}${checksumLine(crc24(packets, CRC24_INIT))}-----END PGP ${kind} BLOCK-----\n`;

function lines(bytes: Buffer): string {
  const b64 = bytes.toString('base64');
  let out = '';
  for (let i = 0; i < b64.length; i += 64) out += `${b64.slice(i, i + 64)}\n`;
  return out;
}

const checksumLine = (crc: number): string => `=${Buffer.from([crc >> 16, (crc >> 8) & 0xff, crc & 0xff]).toString('base64')}\n`;

/** CRC-24 (RFC 9580 §6.1.1), a byte at a time from a table. */
const CRC24_INIT = 0xb704ce;
const CRC24_TABLE = Int32Array.from({ length: 256 }, (_, n) => {
  let crc = n << 16;
  for (let i = 0; i < 8; i++) crc = crc & 0x800000 ? ((crc << 1) ^ 0x1864cfb) & 0xffffff : (crc << 1) & 0xffffff;
  return crc;
});

export function crc24(bytes: Uint8Array, crc: number): number {
  for (let i = 0; i < bytes.length; i++) crc = ((crc << 8) & 0xffffff) ^ CRC24_TABLE[((crc >> 16) ^ bytes[i]!) & 0xff]!;
  return crc;
}
