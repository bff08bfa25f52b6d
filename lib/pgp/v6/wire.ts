import { invalid } from '../../errors';
import { lengthOctets } from '../packets';

/**
 * The byte-level pieces of v6 keys and signatures (RFC 9580): integers, subpackets, and a bounded reader
 * of packet lists held in memory. Keys and signatures are small (a post-quantum key is about 6 KiB), so
 * they are read whole; streamed messages go through ../packets.ts.
 */

export const u32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};

/** A key that cannot be read here: unknown version or algorithm, wrong length, bad or missing self-signature. */
export const badKey = (why: string) => invalid('invalid_key', `Not a readable v6 OpenPGP key: ${why}`);

/** Reads a buffer front to back; every read is checked against its end, and failures go through `fail`. */
export class Cursor {
  private at = 0;
  constructor(
    private readonly buf: Buffer,
    private readonly fail: (why: string) => Error,
  ) {}

  get left(): number {
    return this.buf.length - this.at;
  }

  u8(): number {
    return this.bytes(1)[0];
  }

  u32(): number {
    return this.bytes(4).readUInt32BE(0);
  }

  bytes(n: number): Buffer {
    if (n > this.left) throw this.fail('it ends too early');
    const out = this.buf.subarray(this.at, this.at + n);
    this.at += n;
    return out;
  }

  /** Everything not read yet. */
  rest(): Buffer {
    return this.bytes(this.left);
  }

  /** Throws unless every octet was read: a field of a fixed size followed by anything is malformed. */
  end(what: string): void {
    if (this.left) throw this.fail(`${this.left} octets after the ${what}`);
  }
}

export interface RawPacket {
  tag: number;
  body: Buffer;
}

/**
 * The packets of a binary packet list (RFC 9580 §4.2), new or legacy headers, definite lengths only: keys
 * and signatures never use partial lengths (§4.2.1.4 allows them for data packets alone). At most
 * `maxPackets` packets of at most `maxPacketBytes` octets each.
 */
export function packetList(bytes: Buffer, limits: { maxPackets: number; maxPacketBytes: number }, fail: (why: string) => Error): RawPacket[] {
  const out: RawPacket[] = [];
  const c = new Cursor(bytes, fail);
  while (c.left) {
    if (out.length >= limits.maxPackets) throw fail(`more than ${limits.maxPackets} packets`);
    const ctb = c.u8();
    if (!(ctb & 0x80)) throw fail('an octet that is not a packet header');
    let tag: number;
    let n: number;
    if (ctb & 0x40) {
      tag = ctb & 0x3f;
      const o = c.u8();
      if (o < 192) n = o;
      else if (o < 224) n = ((o - 192) << 8) + c.u8() + 192;
      else if (o === 255) n = c.u32();
      else throw fail(`a partial body length in a packet of type ${tag}`);
    } else {
      tag = (ctb >> 2) & 0x0f;
      const type = ctb & 3;
      if (type === 3) throw fail(`a packet of type ${tag} of indeterminate length`);
      n = c.bytes(1 << type).reduce((v, b) => v * 256 + b, 0);
    }
    if (n > limits.maxPacketBytes) throw fail(`a packet of type ${tag} of ${n} octets (at most ${limits.maxPacketBytes} here)`);
    out.push({ tag, body: c.bytes(n) });
  }
  return out;
}

/** A signature subpacket (RFC 9580 §5.2.3.7): its length (type and data) in the packet length encoding, its type, its data. */
export const subpacket = (type: number, data: Uint8Array): Buffer => Buffer.concat([lengthOctets(data.length + 1), Buffer.from([type]), data]);

export interface Subpacket {
  type: number;
  critical: boolean;
  data: Buffer;
}

/** The subpackets of a signature's hashed or unhashed area. */
export function subpackets(area: Buffer, fail: (why: string) => Error): Subpacket[] {
  const out: Subpacket[] = [];
  const c = new Cursor(area, fail);
  while (c.left) {
    const o = c.u8();
    const n = o < 192 ? o : o < 255 ? ((o - 192) << 8) + c.u8() + 192 : c.u32();
    if (n < 1) throw fail('an empty signature subpacket');
    const body = c.bytes(n);
    out.push({ type: body[0] & 0x7f, critical: !!(body[0] & 0x80), data: body.subarray(1) });
  }
  return out;
}
