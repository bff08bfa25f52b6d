import { invalid } from '../errors';
import { asError } from './thrown';

/**
 * OpenPGP packet framing (RFC 9580 §4.2): writing the packets made on Node's crypto, reading packet
 * headers and bodies from a stream of chunks, and re-framing a packet list for OpenPGP.js.
 */

/** Read size for files and blobs; also the size of the chunks re-framed and decrypted data come in. */
export const CHUNK_BYTES = 1 << 20;

/** RFC 9580 §4.2.1.4 requires the first partial length to be at least 512 octets; we hold every one to it. */
export const MIN_PARTIAL = 512;
/**
 * Most packets besides the data in one packet list (session keys, markers, signatures): real messages
 * have a handful, and each costs a parse, and for OpenPGP.js memory until the data packet.
 */
export const MAX_SMALL_PACKETS = 1024;
/** Largest other packet we read or pass on: RSA-16384 session keys and signatures are a few KiB. */
const MAX_SMALL_PACKET = 64 * 1024;
/** Packets that may be streamed (partial lengths; RFC 9580 §4.2.1.4): compressed, SED, literal, SEIPD, AEAD. */
const DATA_TAGS = new Set([8, 9, 11, 18, 20]);

export const malformed = (why: string) => invalid('malformed_message', `Not a readable OpenPGP message: ${why}`);

// ---------------------------------------------------------------------------------------- writing

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

// ---------------------------------------------------------------------------------------- reading

/** Pulls bytes from an async iterator of chunks; optionally records everything pulled. */
export class Pull {
  private buf: Buffer = Buffer.alloc(0);
  /** An error of the source itself (storage), never to be taken for a malformed message. */
  failed: Error | undefined;
  constructor(
    private readonly it: AsyncIterator<Uint8Array>,
    public record?: Buffer[],
  ) {}

  /** Ensures at least n buffered bytes; false when the source ends first. Linear: one concat per fill. */
  async fill(n: number): Promise<boolean> {
    if (this.buf.length >= n) return true;
    const parts = [this.buf];
    let have = this.buf.length;
    let ended = false;
    while (have < n) {
      let next: IteratorResult<Uint8Array>;
      try {
        next = await this.it.next();
      } catch (err) {
        throw (this.failed = asError(err));
      }
      if (next.done) {
        ended = true;
        break;
      }
      const v = next.value;
      const chunk = Buffer.isBuffer(v) ? v : Buffer.from(v.buffer, v.byteOffset, v.byteLength);
      this.record?.push(chunk);
      parts.push(chunk);
      have += chunk.length;
    }
    this.buf = parts.length === 1 ? parts[0] : parts.length === 2 && !parts[0].length ? parts[1] : Buffer.concat(parts, have);
    return !ended;
  }

  /** Bytes available without waiting for the source. */
  get buffered(): number {
    return this.buf.length;
  }

  /** The next octet without taking it; null at the end. */
  async peek(): Promise<number | null> {
    return (await this.fill(1)) ? this.buf[0] : null;
  }

  /** The next n bytes, n at most `limit` (a packet's size, where the sender states it). */
  async take(n: number, limit = MAX_TAKE): Promise<Buffer> {
    if (n > limit) throw malformed('a packet is larger than this kind of packet can be');
    if (!(await this.fill(n))) throw malformed('it ends too early');
    const out = this.buf.subarray(0, n);
    this.buf = this.buf.subarray(n);
    return out;
  }

  /** Up to `max` bytes: what is buffered, else the next chunk; null at the end. */
  async chunk(max: number): Promise<Buffer | null> {
    if (!this.buf.length && !(await this.fill(1))) return null;
    const out = this.buf.subarray(0, max);
    this.buf = this.buf.subarray(out.length);
    return out;
  }

  async *drain(): AsyncGenerator<Buffer, void> {
    for (let c = await this.chunk(CHUNK_BYTES); c; c = await this.chunk(CHUNK_BYTES)) yield c;
  }
}

/** The most `take` buffers at once: headers, session key packets and prefixes are far smaller. */
const MAX_TAKE = 64 * 1024;

export type Length = { kind: 'definite' | 'partial'; n: number } | { kind: 'indeterminate' };

/** A new-format length (RFC 9580 §4.2.1); partial lengths below MIN_PARTIAL are refused. */
async function newLength(p: Pull): Promise<Length> {
  const o = (await p.take(1))[0];
  if (o < 192) return { kind: 'definite', n: o };
  if (o < 224) return { kind: 'definite', n: ((o - 192) << 8) + (await p.take(1))[0] + 192 };
  if (o === 255) return { kind: 'definite', n: (await p.take(4)).readUInt32BE(0) };
  const n = 1 << (o & 0x1f);
  // Tiny partial chunks cost a header each: 1-octet chunks make a message hundreds of times slower to read.
  if (n < MIN_PARTIAL) throw malformed(`a partial body length of ${n} octets (the minimum is ${MIN_PARTIAL})`);
  return { kind: 'partial', n };
}

/** The packet tag of a header's first octet (new or legacy format), or -1 for a non-header octet. */
export function tagOf(ctb: number): number {
  if (!(ctb & 0x80)) return -1;
  return ctb & 0x40 ? ctb & 0x3f : (ctb >> 2) & 0x0f;
}

/** A packet header, new or legacy format. */
export async function header(p: Pull): Promise<{ tag: number; length: Length }> {
  const ctb = (await p.take(1))[0];
  const tag = tagOf(ctb);
  if (tag < 0) throw malformed('bad packet header');
  if (ctb & 0x40) return { tag, length: await newLength(p) };
  const type = ctb & 3;
  if (type === 3) return { tag, length: { kind: 'indeterminate' } };
  const b = await p.take([1, 2, 4][type]);
  return { tag, length: { kind: 'definite', n: type === 0 ? b[0] : type === 1 ? b.readUInt16BE(0) : b.readUInt32BE(0) } };
}

/**
 * The body of a packet as chunks, following partial lengths. Small pieces (a sender's small partial
 * chunks: gpg's 8 KiB, or what a compressor emitted) are joined up to JOINED_BYTES, or as far as the input
 * has come before waiting for more, so that their size does not become the size of every later step's
 * work; large pieces pass as they are, uncopied.
 */
export async function* body(p: Pull, first: Length): AsyncGenerator<Buffer, void> {
  let pending: Buffer[] = [];
  let size = 0;
  const joined = () => {
    const out = pending.length === 1 ? pending[0] : Buffer.concat(pending, size);
    pending = [];
    size = 0;
    return out;
  };
  let length = first;
  for (;;) {
    if (length.kind === 'indeterminate') {
      if (size) yield joined();
      return yield* p.drain();
    }
    for (let left = length.n; left > 0;) {
      const c = await p.chunk(Math.min(left, CHUNK_BYTES));
      if (!c) throw malformed('a packet is cut short');
      left -= c.length;
      if (c.length >= SMALL_PIECE) {
        if (size) yield joined();
        yield c;
        continue;
      }
      pending.push(c);
      size += c.length;
      if (size >= JOINED_BYTES || p.buffered === 0) yield joined();
    }
    if (length.kind === 'definite') {
      if (size) yield joined();
      return;
    }
    length = await newLength(p);
  }
}

const SMALL_PIECE = 64 * 1024;
const JOINED_BYTES = 256 * 1024;

/** Largest session key packet we read: an RSA-16384 one is about 2 KiB. */
const MAX_SESSION_KEY_PACKET = 8192;

/** The whole body of a packet that is not data (session keys, signatures, markers): definite and at most `limit` octets. */
export async function smallBody(p: Pull, h: { tag: number; length: Length }, limit = MAX_SMALL_PACKET): Promise<Buffer> {
  if (h.length.kind !== 'definite') throw malformed(`a packet of type ${h.tag} without a definite length`);
  if (h.length.n > limit) throw malformed(`a packet of type ${h.tag} longer than ${limit} octets`);
  return p.take(h.length.n);
}

/** A session key packet before an encrypted message's data (RFC 9580 §10.3): public-key (tag 1) or password (tag 3). */
export interface SessionKeyPacket {
  tag: 1 | 3;
  body: Buffer;
}

const MARKER = Buffer.from('PGP');

/**
 * Reads the session key packets at the head of an encrypted message, passing over marker packets (the
 * three octets "PGP", RFC 9580 §5.8), up to the first other packet, which is left unread: its tag is
 * `next` (-1 for an octet that is no packet header, null at the end of the input). Each is definite and
 * at most MAX_SESSION_KEY_PACKET octets, MAX_SMALL_PACKETS in all. What may come next is the caller's.
 */
export async function sessionKeyPackets(p: Pull): Promise<{ packets: SessionKeyPacket[]; next: number | null }> {
  const packets: SessionKeyPacket[] = [];
  for (let n = 1; ; n++) {
    const ctb = await p.peek();
    if (ctb === null) return { packets, next: null };
    const tag = tagOf(ctb);
    if (tag !== 1 && tag !== 3 && tag !== 10) return { packets, next: tag };
    if (n > MAX_SMALL_PACKETS) throw malformed(`more than ${MAX_SMALL_PACKETS} packets before the encrypted data`);
    const body = Buffer.from(await smallBody(p, await header(p), MAX_SESSION_KEY_PACKET)); // copied: kept past later reads
    if (tag !== 10) packets.push({ tag, body });
    else if (!body.equals(MARKER)) throw malformed('a marker packet that is not "PGP"');
  }
}

// ---------------------------------------------------------------------------------------- re-framing

/**
 * Rewrites the framing of a packet list, not the packets' contents, for OpenPGP.js to parse: a body sent
 * in partial-length chunks (gpg 2.2 uses 8 KiB ones) is re-chunked into CHUNK_BYTES pieces. OpenPGP.js's
 * cost is per chunk, so gpg's messages parse several times faster this way (docs/performance.md);
 * integrity is unaffected: signatures, the MDC and AEAD tags cover contents, not length headers. Other
 * packets are held to MAX_SMALL_PACKET octets and MAX_SMALL_PACKETS in number (OpenPGP.js buffers them
 * whole). `refuse`: tags that may not appear in this list (refused at once, as malformed).
 */
export async function* reframe(chunks: AsyncIterable<Uint8Array>, refuse: ReadonlySet<number> = new Set()): AsyncGenerator<Uint8Array> {
  const r = new Pull(chunks[Symbol.asyncIterator]());
  let small = 0;
  for (;;) {
    const ctb = await r.peek();
    if (ctb === null) return;
    await r.take(1);
    const packetTag = tagOf(ctb);
    if (packetTag < 0) throw malformed('invalid packet header');
    if (refuse.has(packetTag)) throw malformed(`a packet of type ${packetTag} where it may not be`);
    const isData = DATA_TAGS.has(packetTag);
    if (!isData && ++small > MAX_SMALL_PACKETS) throw malformed(`more than ${MAX_SMALL_PACKETS} packets besides the data`);
    const checkLength = (n: number) => {
      if (packetTag === 10 && n !== 3) throw malformed('a marker packet that is not "PGP"'); // RFC 9580 §5.8
      if (!isData && n > MAX_SMALL_PACKET) throw malformed(`a packet of type ${packetTag} longer than ${MAX_SMALL_PACKET} octets`);
    };
    if (!(ctb & 0x40)) {
      // Legacy format: lengths of 1, 2 or 4 octets, or "until the end" (type 3).
      const type = ctb & 3;
      if (type === 3) {
        if (!isData) throw malformed(`a packet of type ${packetTag} of indeterminate length`);
        yield Uint8Array.of(ctb);
        yield* r.drain();
        return;
      }
      const length = await r.take(1 << type);
      const n = length.reduce((n, b) => n * 256 + b, 0);
      checkLength(n);
      yield Buffer.concat([Uint8Array.of(ctb), length]);
      yield* body(r, { kind: 'definite', n });
      continue;
    }
    const first = (await r.take(1))[0];
    if (first < 224 || first === 255) {
      const rest = await r.take(first < 192 ? 0 : first < 224 ? 1 : 4);
      const n = definiteLength(first, rest);
      checkLength(n);
      yield Buffer.concat([Uint8Array.of(ctb, first), rest]);
      yield* body(r, { kind: 'definite', n });
      continue;
    }
    if (!isData) throw malformed(`partial body lengths in a packet of type ${packetTag}`); // RFC 9580 §4.2.1.4
    if (2 ** (first & 0x1f) < MIN_PARTIAL) throw malformed(`a partial body length below ${MIN_PARTIAL} octets`);
    // Partial body lengths: collect and re-emit as CHUNK_BYTES partial chunks plus a definite last one.
    yield Uint8Array.of(ctb);
    let pending: Buffer[] = [];
    let pendingBytes = 0;
    for await (const piece of body(r, { kind: 'partial', n: 2 ** (first & 0x1f) })) {
      pending.push(piece);
      pendingBytes += piece.length;
      // Full chunks; and whatever is here before waiting for input, so nothing stalls on a slow source.
      const waiting = r.buffered === 0 && pendingBytes >= 512;
      while (pendingBytes >= CHUNK_BYTES || (waiting && pendingBytes >= 512)) {
        const n = Math.min(CHUNK_BYTES, 2 ** Math.floor(Math.log2(pendingBytes)));
        const all = Buffer.concat(pending);
        yield Uint8Array.of(224 + Math.log2(n));
        yield all.subarray(0, n);
        pending = [all.subarray(n)];
        pendingBytes -= n;
      }
    }
    yield fiveOctetLength(pendingBytes);
    if (pendingBytes) yield Buffer.concat(pending);
  }
}

function fiveOctetLength(n: number): Buffer {
  const header = Buffer.alloc(5);
  header[0] = 255;
  header.writeUInt32BE(n, 1);
  return header;
}

function definiteLength(first: number, rest: Uint8Array): number {
  if (first < 192) return first;
  if (first < 224) return ((first - 192) << 8) + rest[0] + 192;
  return new DataView(rest.buffer, rest.byteOffset, 4).getUint32(0);
}
