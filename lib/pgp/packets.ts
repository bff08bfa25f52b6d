/** OpenPGP packet framing (RFC 9580 §4.2.1, the new format), for the packets written on Node's crypto. */

/** A body length in one, two or five octets. */
export function lengthOctets(n: number): Buffer {
  if (n < 192) return Buffer.from([n]);
  if (n < 8384) return Buffer.from([((n - 192) >> 8) + 192, (n - 192) & 0xff]);
  const b = Buffer.alloc(5);
  b[0] = 0xff;
  b.writeUInt32BE(n, 1);
  return b;
}

/** A Curve25519 point in OpenPGP's legacy encoding: the MPI of 0x40 ‖ its 32 octets (263 bits). */
export const legacyPoint = (raw: Uint8Array): Buffer => Buffer.concat([Buffer.from([0x01, 0x07, 0x40]), raw]);

/** A whole packet: its tag, its length, its body. */
export const packet = (tag: number, body: Uint8Array): Buffer => Buffer.concat([Buffer.from([0xc0 | tag]), lengthOctets(body.length), body]);
