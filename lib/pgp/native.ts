import * as crypto from 'node:crypto';
import { Readable } from 'node:stream';
import * as openpgp from 'openpgp';
import { AppError, invalid } from '../errors';
import { ONE_PIECE } from '../streams';
import { cfbDecryptor } from './cfb';
import { lengthOctets, packet } from './packets';
import { sessionKeyPacket } from './pkesk';
import { afterDecryption, integrityFailure } from './integrity';
import { sessionKeyV1 } from './session';
import { asError } from './thrown';

/**
 * SEIPDv1 (RFC 9580 §5.13.1, "MDC") encryption on Node's own AES-256-CFB and SHA-1 (OpenSSL), for the
 * common case: a v4 recipient, binary output, no compression. OpenPGP.js still makes the session-key
 * packet (public-key crypto); only the bulk data is done here, streaming in 1 MiB packets, several
 * times faster than OpenPGP.js's JavaScript AES and with flat, small memory. The output is the same
 * message format gpg 2.2, Sequoia and OpenPGP.js read (tests check all three).
 */

const CHUNK = 1 << 20; // partial body length 2^20: a power of two, and well above the 512-byte minimum
const TAG_LITERAL = 11;
const TAG_SEIPD = 18;
const MDC_HEADER = Buffer.from([0xd3, 0x14]); // new-format packet 19, length 20

/** Whether encryptNative can produce this message (else the caller uses OpenPGP.js). */
export function nativeEncryptable(recipient: openpgp.PublicKey, opts: { armor: boolean; compress?: boolean }): boolean {
  return !opts.armor && !opts.compress && recipient.keyPacket.version === 4;
}

/**
 * Writes one packet of unknown length: full 1 MiB pieces with partial-length headers as the body
 * grows, and the rest with a definite length at the end.
 */
class PacketWriter {
  private pieces: Buffer[] = [];
  private size = 0;
  private started = false;

  constructor(private readonly tag: number) {}

  private header(octets: Buffer): Buffer {
    if (this.started) return octets;
    this.started = true;
    return Buffer.concat([Buffer.from([0xc0 | this.tag]), octets]);
  }

  /** Adds body bytes; returns what is ready to go out: headers and slices of the input, never copies. */
  push(data: Buffer): Buffer[] {
    if (data.length) this.pieces.push(data);
    this.size += data.length;
    const out: Buffer[] = [];
    while (this.size >= CHUNK) {
      out.push(this.header(Buffer.from([224 + 20])));
      for (let need = CHUNK; need > 0;) {
        const piece = this.pieces[0];
        if (piece.length <= need) {
          out.push(piece);
          this.pieces.shift();
          need -= piece.length;
        } else {
          out.push(piece.subarray(0, need));
          this.pieces[0] = piece.subarray(need);
          need = 0;
        }
      }
      this.size -= CHUNK;
    }
    return out;
  }

  /** The final piece, with a definite length (possibly zero). */
  end(): Buffer[] {
    const out = [this.header(lengthOctets(this.size)), ...this.pieces];
    this.pieces = [];
    this.size = 0;
    return out;
  }
}

export async function encryptNative(input: Readable, recipient: openpgp.PublicKey, opts: { filename?: string; date?: Date }): Promise<Readable> {
  const filename = Buffer.from(opts.filename ?? '', 'utf8');
  if (filename.length > 255) throw invalid('invalid_filename', 'The file name must be at most 255 bytes of UTF-8.');
  const sessionKey = crypto.randomBytes(32);
  let pkesk: Uint8Array;
  try {
    pkesk = await sessionKeyPacket(recipient, 'aes256', sessionKey);
  } catch (err) {
    input.destroy();
    throw invalid('no_encryption_key', `Cannot encrypt to this key: ${err instanceof Error ? err.message : String(err)}`);
  }

  async function* message(): AsyncGenerator<Buffer> {
    yield Buffer.from(pkesk);
    const seipd = new PacketWriter(TAG_SEIPD);
    const literal = new PacketWriter(TAG_LITERAL);
    const cipher = crypto.createCipheriv('aes-256-cfb', sessionKey, Buffer.alloc(16)); // SEIPDv1: CFB, zero IV, no resync
    const mdc = crypto.createHash('sha1');
    const seal = (plain: Buffer[], hashed = true): Buffer[] => {
      const out: Buffer[] = [];
      for (const p of plain) {
        if (!p.length) continue;
        if (hashed) mdc.update(p);
        out.push(...seipd.push(cipher.update(p)));
      }
      return out;
    };

    yield* seipd.push(Buffer.from([1])); // packet version, not encrypted
    const prefix = crypto.randomBytes(16);
    yield* seal([prefix, prefix.subarray(14, 16)]); // random block, last two octets repeated (quick check)
    const date = Buffer.alloc(4);
    date.writeUInt32BE(Math.floor((opts.date ?? new Date()).getTime() / 1000));
    yield* seal(literal.push(Buffer.concat([Buffer.from([0x62, filename.length]), filename, date]))); // 'b'inary
    for await (const chunk of input) yield* seal(literal.push(chunk as Buffer));
    yield* seal(literal.end());
    yield* seal([MDC_HEADER]); // the MDC covers its own two header octets…
    yield* seal([mdc.digest()], false); // …but not the hash
    const tail = cipher.final();
    if (tail.length) yield* seipd.push(tail);
    yield* seipd.end();
  }

  // An input error ends the generator with that error, which destroys the output with it.
  return Readable.from(message(), ONE_PIECE);
}

// ---------------------------------------------------------------------------------------- decrypt

/** What openEncrypted (stream.ts) returns; repeated here to keep the two paths interchangeable. */
export interface NativeOpened {
  encryptionKeyIds: string[];
  decrypt(privateKey: openpgp.PrivateKey): Promise<Readable & { filename: string }>;
}

const malformed = (why: string) => invalid('malformed_message', `Not a readable OpenPGP message: ${why}`);

/** The AES of each session key algorithm we decrypt (in CFB mode, on its ECB: see cfb.ts). */
const ECB: Record<string, string> = { aes128: 'aes-128-ecb', aes192: 'aes-192-ecb', aes256: 'aes-256-ecb' };

/** The most `take` buffers at once: headers, session key packets and prefixes are far smaller. */
const MAX_TAKE = 64 * 1024;
/** RFC 9580 §4.2.1.4 requires the first partial length to be at least 512 octets; we hold every one to it. */
export const MIN_PARTIAL = 512;
/**
 * Most packets besides the data in one packet list (session keys, markers, signatures): real messages
 * have a handful, and each costs a parse, and for OpenPGP.js memory until the data packet.
 */
export const MAX_SMALL_PACKETS = 1024;

/** Pulls bytes from an async iterator of Buffers; optionally records everything pulled (for a replay). */
class Pull {
  private buf: Buffer = Buffer.alloc(0);
  /** An error of the source itself (storage), never to be taken for a malformed message. */
  failed: Error | undefined;
  constructor(
    private readonly it: AsyncIterator<Buffer>,
    public record?: Buffer[],
  ) {}

  /** Ensures at least n buffered bytes; false when the source ends first. Linear: one concat per fill. */
  async fill(n: number): Promise<boolean> {
    if (this.buf.length >= n) return true;
    const parts = [this.buf];
    let have = this.buf.length;
    let ended = false;
    while (have < n) {
      let next: IteratorResult<Buffer>;
      try {
        next = await this.it.next();
      } catch (err) {
        throw (this.failed = asError(err));
      }
      if (next.done) {
        ended = true;
        break;
      }
      const chunk = Buffer.isBuffer(next.value) ? next.value : Buffer.from(next.value);
      this.record?.push(chunk);
      parts.push(chunk);
      have += chunk.length;
    }
    this.buf = parts.length === 1 ? parts[0] : parts.length === 2 && !parts[0].length ? parts[1] : Buffer.concat(parts, have);
    return !ended;
  }

  async take(n: number): Promise<Buffer> {
    if (n > MAX_TAKE) throw malformed('a packet is larger than this kind of packet can be');
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
    for (let c = await this.chunk(CHUNK); c; c = await this.chunk(CHUNK)) yield c;
  }
}

type Length = { kind: 'definite' | 'partial'; n: number } | { kind: 'indeterminate' };

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

/** A packet header, new or old format. */
async function header(p: Pull): Promise<{ tag: number; length: Length }> {
  const ctb = (await p.take(1))[0];
  if (!(ctb & 0x80)) throw malformed('bad packet header');
  if (ctb & 0x40) return { tag: ctb & 0x3f, length: await newLength(p) };
  const type = ctb & 3;
  const tag = (ctb >> 2) & 0x0f;
  if (type === 3) return { tag, length: { kind: 'indeterminate' } };
  const b = await p.take([1, 2, 4][type]);
  return { tag, length: { kind: 'definite', n: type === 0 ? b[0] : type === 1 ? b.readUInt16BE(0) : b.readUInt32BE(0) } };
}

/** The body of a packet as chunks, following partial lengths. */
async function* body(p: Pull, first: Length): AsyncGenerator<Buffer, void> {
  let length = first;
  for (;;) {
    if (length.kind === 'indeterminate') return yield* p.drain();
    for (let left = length.n; left > 0;) {
      const c = await p.chunk(Math.min(left, CHUNK));
      if (!c) throw malformed('a packet is cut short');
      left -= c.length;
      yield c;
    }
    if (length.kind === 'definite') return;
    length = await newLength(p);
  }
}

const MARKER = Buffer.from('PGP');

/** The tag of a packet from its first octet (new or legacy format), or -1 for a non-header octet. */
function innerTag(ctb: number): number {
  if (!(ctb & 0x80)) return -1;
  return ctb & 0x40 ? ctb & 0x3f : (ctb >> 2) & 0x0f;
}

/** What the fallback gets: every byte read so far, then the rest; and the session key, if known by then. */
export type Fallback = (replayed: Readable, sessionKey?: openpgp.SessionKey) => Promise<NativeOpened>;

async function* replay(recorded: Buffer[], rest: AsyncIterator<Buffer>): AsyncGenerator<Buffer> {
  yield* recorded;
  for (let n = await rest.next(); !n.done; n = await rest.next()) yield n.value;
}

/**
 * Opens a binary message of public-key session key packets (v3) and one SEIPDv1 packet holding a
 * literal data packet, and decrypts it on Node's AES (CFB computed through ECB: cfb.ts) and SHA-1.
 * Anything else OpenPGP (passwords, AEAD, compression, signatures, other ciphers) goes to `fallback`,
 * given a stream that replays every byte read; anything else inside the encrypted data is refused.
 * The final output chunk is held back until the MDC has been verified; a failed check errors the stream.
 * Once the session key is known, every failure is integrity.ts's one error (an input error excepted).
 */
export async function openNative(input: Readable, fallback: Fallback): Promise<NativeOpened> {
  const it = input[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  const recorded: Buffer[] = [];
  const p = new Pull(it, recorded);
  const giveUp = (sessionKey?: openpgp.SessionKey) => {
    const replayed = Readable.from(replay(recorded, it), { objectMode: false });
    replayed.once('close', () => input.destroy()); // the replay does not end `it` by itself
    return fallback(replayed, sessionKey);
  };

  if (!(await p.fill(1))) return giveUp();
  const pkesks: Buffer[] = [];
  const keyIds: string[] = [];
  let seipd: Length | undefined;
  try {
    for (let n = 1; !seipd; n++) {
      if (n > MAX_SMALL_PACKETS) throw malformed(`more than ${MAX_SMALL_PACKETS} packets before the encrypted data`);
      const h = await header(p);
      if (h.tag === 18) seipd = h.length;
      else if (h.tag === 1 && h.length.kind === 'definite' && h.length.n < 8192) {
        const body = await p.take(h.length.n);
        if (body[0] !== 3) return giveUp(); // v6 session key packets go with SEIPDv2
        keyIds.push(body.subarray(1, 9).toString('hex'));
        pkesks.push(packet(1, body));
      } else if (h.tag === 10) {
        // A marker packet is the three octets "PGP" (RFC 9580 §5.8), nothing longer.
        if (h.length.kind !== 'definite' || h.length.n !== 3 || !(await p.take(3)).equals(MARKER)) throw malformed('a marker packet that is not "PGP"');
      } else return giveUp();
    }
  } catch (err) {
    if (p.failed) throw p.failed; // the storage failed: not a judgement on the message, and retried
    if (err instanceof AppError) throw err;
    return giveUp(); // something OpenPGP.js should judge
  }
  if (!pkesks.length) return giveUp();
  const bodyPull = new Pull(body(p, seipd));

  return {
    encryptionKeyIds: keyIds,
    async decrypt(privateKey) {
      if (!privateKey.isDecrypted()) throw new Error('decrypt needs an unlocked private key');
      let sessionKey: openpgp.SessionKey | undefined;
      try {
        const message = await openpgp.readMessage({ binaryMessage: Buffer.concat(pkesks) });
        sessionKey = await sessionKeyV1(message, privateKey);
      } catch (err) {
        input.destroy();
        throw err instanceof AppError ? err : invalid('no_matching_key', 'The message is not encrypted to this key.');
      }
      const ecbName = sessionKey?.algorithm ? ECB[sessionKey.algorithm] : undefined;
      if ((await bodyPull.take(1))[0] !== 1 || !sessionKey || !ecbName) return (await giveUp(sessionKey)).decrypt(privateKey);

      // Decryption begins: from here on a failure answers integrity.ts's one error, whatever failed.
      const failed = (err: unknown) => {
        input.destroy(); // stop reading the file
        return afterDecryption(err, { inputError: p.failed });
      };
      const cfb = cfbDecryptor(ecbName, Buffer.from(sessionKey.data));
      const decipher = (c: Buffer) => Buffer.concat(cfb.update(c));
      const mdc = crypto.createHash('sha1');
      const hashed = (b: Buffer) => (mdc.update(b), b);

      /** The literal packet's file name and data, or null when OpenPGP.js reads the inner packets. */
      async function readHead(): Promise<{ filename: string; data: Pull; inner: Pull } | null> {
        // The prefix's repeated octets ("quick check") are not consulted: RFC 9580 §14.4 warns against
        // acting on them (an oracle); the MDC, which covers the prefix, decides at the end.
        mdc.update(decipher(await bodyPull.take(18)));
        const ctb = decipher(await bodyPull.take(1));
        switch (innerTag(ctb[0])) {
          case 11: // literal data: ours to read
            break;
          case 8: // compressed, one-pass signature, signature, padding: OpenPGP.js reads those
          case 4:
          case 2:
          case 21: {
            // OpenPGP.js's cost is per partial chunk: hold its first one to the 512-octet minimum too.
            const length = ctb[0] & 0x40 ? decipher(await bodyPull.take(1))[0] : 0;
            if (length >= 224 && length < 255 && 1 << (length & 0x1f) < MIN_PARTIAL) throw malformed('a partial body length below the minimum');
            return null;
          }
          default:
            // Anything else here (another encrypted packet: a one-octet change does that) is refused at
            // once; OpenPGP.js never settles on some of these.
            throw malformed('the encrypted data does not hold a literal, compressed or signed message');
        }
        p.record = undefined;
        recorded.length = 0;

        async function* plaintext(): AsyncGenerator<Buffer> {
          yield ctb;
          for await (const c of bodyPull.drain()) yield* cfb.update(c);
          if (await p.fill(1)) throw malformed('data after the encrypted packet');
        }
        // Everything but the trailing MDC packet (22 octets), which is checked at the end.
        async function* verified(): AsyncGenerator<Buffer> {
          let tail: Buffer = Buffer.alloc(0);
          for await (const c of plaintext()) {
            const all = tail.length + c.length;
            if (all <= 22) {
              tail = Buffer.concat([tail, c]);
              continue;
            }
            const cut = all - 22;
            if (cut >= tail.length) {
              if (tail.length) yield hashed(tail);
              yield hashed(c.subarray(0, cut - tail.length));
              tail = c.subarray(cut - tail.length);
            } else {
              yield hashed(tail.subarray(0, cut));
              tail = Buffer.concat([tail.subarray(cut), c]);
            }
          }
          if (tail.length !== 22 || tail[0] !== 0xd3 || tail[1] !== 0x14) throw integrityFailure();
          mdc.update(tail.subarray(0, 2));
          if (!crypto.timingSafeEqual(mdc.digest(), tail.subarray(2))) throw integrityFailure();
        }

        const inner = new Pull(verified()[Symbol.asyncIterator]());
        const literal = await header(inner);
        if (literal.tag !== 11) throw malformed('no literal data packet');
        const data = new Pull(body(inner, literal.length));
        const nameLength = (await data.take(2))[1]; // format octet, then the file name's length
        const filename = (await data.take(nameLength)).toString('utf8');
        await data.take(4); // date
        return { filename, data, inner };
      }

      let head: Awaited<ReturnType<typeof readHead>>;
      try {
        head = await readHead();
      } catch (err) {
        throw failed(err);
      }
      // The session key goes along: OpenPGP.js's failures from here on are classified alike (stream.ts).
      if (!head) return (await giveUp(sessionKey)).decrypt(privateKey);
      const { data, inner } = head;

      async function* output(): AsyncGenerator<Buffer> {
        let complete = false;
        try {
          let held: Buffer | undefined;
          for await (const c of data.drain()) {
            if (held) yield held;
            held = c;
          }
          if (await inner.fill(1)) throw malformed('data after the literal packet'); // also runs the MDC check
          complete = true;
          if (held) yield held;
        } catch (err) {
          throw failed(err);
        } finally {
          if (!complete) input.destroy(); // the reader went away or the message failed: stop reading the file
        }
      }
      return Object.assign(Readable.from(output(), ONE_PIECE), { filename: head.filename });
    },
  };
}
