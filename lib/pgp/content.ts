import { createInflate, createInflateRaw } from 'node:zlib';
import type { Transform } from 'node:stream';
import unbzip2Stream from '@openpgp/unbzip2-stream';
import * as openpgp from 'openpgp';
import { pullStream } from '../streams';
import { MAX_SMALL_PACKETS, Pull, body, header, malformed, reframe, smallBody, tagOf } from './packets';
import { openpgpKeys, type VerificationKey, type VerificationResult } from './verification';
import type { Watch } from './watch';

/**
 * The content of an OpenPGP message (RFC 9580 §10.3): what encrypted data holds once decrypted, and
 * what a signed message is. Literal data, compressed data (Node's zlib; bzip2 by the OpenPGP.js
 * project's decoder) and the packets of a signature are read here, streamed, under our own framing
 * limits (packets.ts). Only verifying signatures goes to OpenPGP.js, through its public `readMessage`
 * and `verify`, given a flat list re-framed here: one-pass signatures, literal data and signatures,
 * never compressed or encrypted packets.
 */

export interface ContentOptions {
  /** Cap on the size of each layer of decompressed data (decompression bombs). */
  maxDecompressedBytes: number;
  /** Verify the signatures of a signed message against these keys. */
  verify?: VerificationKey[];
  /** Every call into OpenPGP.js and every read of its output goes through it (watch.ts). */
  watch: Watch;
}

export interface Content {
  /** From the literal data packet ('' when none). */
  filename: string;
  /** The literal data. Its iteration ends only once the packets have been read to their end and found well formed. */
  data: AsyncIterable<Buffer>;
  /** With `verify`, of a signed message: its signatures, settled once `data` has been read. */
  signatures?: VerificationResult[];
}

/** Compressed data inside compressed data, and no deeper (gpg's limit too). */
const MAX_NESTING = 2;
/** What may precede or follow the literal data: one-pass signatures and signatures (not verified: no keys), padding. */
const AROUND_LITERAL = new Set([2, 4, 21]);
/** What may follow compressed data: padding only. */
const PADDING = new Set([21]);
/** Not in a signed list handed to OpenPGP.js: session keys, encrypted data, compressed data. */
const NOT_IN_SIGNED_LIST = new Set([1, 3, 8, 9, 18, 20]);

/** Reads the content of `packets`; anything but literal, compressed or signed data is refused at once (malformed). */
export async function readContent(packets: Pull, opts: ContentOptions): Promise<Content> {
  return read(packets, opts, 0);
}

async function read(packets: Pull, opts: ContentOptions, depth: number): Promise<Content> {
  const first = await packets.peek();
  if (first === null) throw malformed('it holds no data');
  const tag = tagOf(first);
  if (tag === 8) return readCompressed(packets, opts, depth);
  if ((tag === 4 || tag === 2) && opts.verify) return readSigned(packets, opts.verify, opts.watch);
  return readLiteral(packets);
}

/**
 * Reads past packets that hold nothing for the caller (signatures not being verified, padding): only
 * `allowed` tags, small, and at most MAX_SMALL_PACKETS of them.
 */
function skipper(packets: Pull, allowed: ReadonlySet<number>, where: string) {
  let small = 0;
  return async (h: Awaited<ReturnType<typeof header>>) => {
    if (!allowed.has(h.tag)) throw malformed(`a packet of type ${h.tag} ${where}`);
    if (++small > MAX_SMALL_PACKETS) throw malformed(`more than ${MAX_SMALL_PACKETS} packets besides the data`);
    await smallBody(packets, h);
  };
}

async function readLiteral(packets: Pull): Promise<Content> {
  const skip = skipper(packets, AROUND_LITERAL, 'where literal data or signatures belong');
  let h = await header(packets);
  while (h.tag !== 11) {
    await skip(h);
    h = await header(packets);
  }
  const literal = new Pull(body(packets, h.length));
  const nameLength = (await literal.take(2))[1]; // format octet, then the file name's length
  const filename = (await literal.take(nameLength)).toString('utf8');
  await literal.take(4); // date
  async function* data(): AsyncGenerator<Buffer> {
    yield* literal.drain();
    while ((await packets.peek()) !== null) await skip(await header(packets));
  }
  return { filename, data: data() };
}

async function readCompressed(packets: Pull, opts: ContentOptions, depth: number): Promise<Content> {
  if (depth >= MAX_NESTING) throw malformed('compressed data nested too deep');
  const compressed = new Pull(body(packets, (await header(packets)).length));
  const algorithm = (await compressed.take(1))[0];
  async function* capped(): AsyncGenerator<Buffer> {
    let inflated = 0;
    for await (const c of decompress(compressed, algorithm)) {
      inflated += c.length;
      if (inflated > opts.maxDecompressedBytes) throw malformed(`its data decompresses to more than ${opts.maxDecompressedBytes} bytes`);
      yield c;
    }
  }
  const inner = await read(new Pull(capped()[Symbol.asyncIterator]()), opts, depth + 1);
  const skip = skipper(packets, PADDING, 'after compressed data');
  async function* data(): AsyncGenerator<Buffer> {
    yield* inner.data;
    while ((await packets.peek()) !== null) await skip(await header(packets));
  }
  return { ...inner, data: data() };
}

/** The decompressed data of a Compressed Data packet's body (after its algorithm octet). */
function decompress(compressed: Pull, algorithm: number): AsyncIterable<Buffer> {
  switch (algorithm) {
    case 0:
      return compressed.drain();
    case 1:
      return throughZlib(compressed, createInflateRaw({ chunkSize: ZLIB_CHUNK }));
    case 2:
      return throughZlib(compressed, createInflate({ chunkSize: ZLIB_CHUNK }));
    case 3:
      return bunzip2(compressed);
    default:
      throw malformed(`compression algorithm ${algorithm}`);
  }
}

const ZLIB_CHUNK = 256 * 1024;

/**
 * Inflates `input` as it is read. Once the zlib stream has ended, the rest of the input is read and
 * dropped (Sequoia pads compressed data there), so that what encloses it is read to its end.
 */
async function* throughZlib(input: Pull, z: Transform): AsyncGenerator<Buffer> {
  let ended = false;
  let abandoned = false;
  z.once('end', () => (ended = true));
  const fed = (async () => {
    for await (const c of input.drain()) {
      if (abandoned) return;
      if (ended || z.destroyed) continue;
      if (!z.write(c)) await writable(z);
    }
    if (!z.destroyed) z.end();
  })();
  fed.catch((err: unknown) => z.destroy(err instanceof Error ? err : new Error(String(err))));
  let complete = false;
  try {
    for await (const c of z) yield c as Buffer;
    await fed;
    complete = true;
  } finally {
    if (!complete) {
      abandoned = true;
      z.destroy();
    }
  }
}

const writable = (z: Transform) =>
  new Promise<void>((resolve) => {
    const done = () => {
      z.off('drain', done);
      z.off('close', done);
      resolve();
    };
    z.on('drain', done);
    z.on('close', done);
  });

async function* bunzip2(input: Pull): AsyncGenerator<Buffer> {
  const source = input.drain();
  const compressed = pullStream(source);
  const reader = unbzip2Stream(compressed).getReader();
  try {
    for (let r = await reader.read(); !r.done; r = await reader.read()) yield Buffer.from(r.value.buffer, r.value.byteOffset, r.value.byteLength);
  } catch (err) {
    throw malformed(`bzip2 data: ${err instanceof Error ? err.message : String(err)}`);
  } finally {
    reader.releaseLock();
    await source.return();
  }
}

/**
 * A signed list (one-pass signatures, literal data, signatures; or signatures, then literal data),
 * verified by OpenPGP.js as its bytes flow. Once its data has ended and the signatures have settled,
 * the list is read on to its end (OpenPGP.js may stop at the last signature).
 */
async function readSigned(packets: Pull, keys: VerificationKey[], watch: Watch): Promise<Content> {
  const source = reframe(packets.drain(), NOT_IN_SIGNED_LIST);
  // OpenPGP.js waiting on our input is not idle.
  const stream = pullStream({ next: () => watch.pulling(source.next()) });
  const message = await watch.call(openpgp.readMessage({ binaryMessage: stream }));
  const result = await watch.call(openpgp.verify({ message, verificationKeys: openpgpKeys(keys), format: 'binary' }));
  const filename = message.getFilename() ?? '';
  async function* data(): AsyncGenerator<Buffer> {
    const reader = result.data.getReader();
    for (;;) {
      const r = await watch.call(reader.read());
      watch.moved();
      if (r.done) break;
      const v = r.value;
      yield typeof v === 'string' ? Buffer.from(v) : Buffer.from(v.buffer, v.byteOffset, v.byteLength);
    }
    await watch.call(Promise.allSettled(result.signatures.map((s) => s.verified)));
    for (let next = await source.next(); !next.done; next = await source.next());
  }
  return { filename, data: data(), signatures: result.signatures };
}
