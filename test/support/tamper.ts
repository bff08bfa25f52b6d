import * as openpgp from 'openpgp';

/** Where the body of the first packet with `tag` starts in a binary OpenPGP message (new or old format headers). */
export function packetBody(message: Buffer, tag: number): number {
  let at = 0;
  while (at < message.length) {
    const first = message[at];
    if (!(first & 0x80)) throw new Error(`not a packet header at ${at}`);
    let t: number;
    let bodyAt: number;
    let length: number;
    if (first & 0x40) {
      t = first & 0x3f;
      const o = message[at + 1];
      if (o < 192) [bodyAt, length] = [at + 2, o];
      else if (o < 224) [bodyAt, length] = [at + 3, ((o - 192) << 8) + message[at + 2] + 192];
      else if (o === 255) [bodyAt, length] = [at + 6, message.readUInt32BE(at + 2)];
      else [bodyAt, length] = [at + 2, 1 << (o & 0x1f)]; // partial: the first chunk
    } else {
      t = (first >> 2) & 0x0f;
      const type = first & 3;
      const n = [1, 2, 4][type];
      bodyAt = at + 1 + n;
      length = n === 1 ? message[at + 1] : n === 2 ? message.readUInt16BE(at + 1) : message.readUInt32BE(at + 1);
    }
    if (t === tag) return bodyAt;
    at = bodyAt + length;
  }
  throw new Error(`no packet with tag ${tag}`);
}

/**
 * The review's one-byte change: XOR 0xCB ^ 0xD2 into byte 18 of a SEIPDv1 packet's encrypted data, so
 * that (under CFB) the first inner packet reads as an encrypted-data packet instead of literal data.
 */
export function flipInnerTag(message: Buffer): Buffer {
  const out = Buffer.from(message);
  const encryptedData = packetBody(out, 18) + 1; // after the version octet
  out[encryptedData + 18] ^= 0xcb ^ 0xd2;
  return out;
}

export const armorMessage = (message: Buffer) => Buffer.from(openpgp.armor(openpgp.enums.armor.message, message));
