import { invalid } from '../errors';

/**
 * ASCII armor (RFC 9580 §6.2), written and read. Written 64 characters a line, with the CRC24 line: RFC 9580 §6.1 says not to
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

/** A detached signature's armor (`.asc`). */
export const armorSignature = (packets: Buffer): string =>
  `-----BEGIN PGP SIGNATURE-----\n\n${lines(packets)}${checksumLine(crc24(packets, CRC24_INIT))}-----END PGP SIGNATURE-----\n`;

function lines(bytes: Buffer): string {
  const b64 = bytes.toString('base64');
  let out = '';
  for (let i = 0; i < b64.length; i += 64) out += `${b64.slice(i, i + 64)}\n`;
  return out;
}

const checksumLine = (crc: number): string => `=${Buffer.from([crc >> 16, (crc >> 8) & 0xff, crc & 0xff]).toString('base64')}\n`;

/**
 * CRC-24 (RFC 9580 §6.1.1), eight octets at a time ("slicing-by-8": ~1 GiB/s here, where a table lookup
 * per octet ran at ~360 MiB/s, a third of base64's speed). The register is kept in the top 24 bits of a
 * 32-bit word so that four octets XOR into it whole; table k (at k × 256) advances an octet past k more
 * zero octets.
 */
const CRC24_INIT = 0xb704ce;
const CRC24_TABLES = (() => {
  const t = new Int32Array(8 * 256);
  for (let n = 0; n < 256; n++) {
    let r = n << 24;
    for (let i = 0; i < 8; i++) r = r & 0x80000000 ? (r << 1) ^ (0x864cfb << 8) : r << 1;
    t[n] = r;
  }
  for (let i = 256; i < t.length; i++) t[i] = (t[i - 256] << 8) ^ t[t[i - 256] >>> 24];
  return t;
})();

export function crc24(bytes: Uint8Array, crc: number): number {
  const t = CRC24_TABLES;
  const words = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let r = crc << 8;
  let i = 0;
  for (const end = bytes.length - 7; i < end; i += 8) {
    r ^= words.getInt32(i);
    const w = words.getInt32(i + 4);
    r =
      t[1792 + (r >>> 24)] ^
      t[1536 + ((r >>> 16) & 0xff)] ^
      t[1280 + ((r >>> 8) & 0xff)] ^
      t[1024 + (r & 0xff)] ^
      t[768 + (w >>> 24)] ^
      t[512 + ((w >>> 16) & 0xff)] ^
      t[256 + ((w >>> 8) & 0xff)] ^
      t[w & 0xff];
  }
  for (; i < bytes.length; i++) r = (r << 8) ^ t[(r >>> 24) ^ bytes[i]];
  return (r >>> 8) & 0xffffff;
}

/** Longer than any read plus what is carried over, so only a line that never ends can reach it. */
const MAX_ARMOR_LINE = 4 << 20;

const malformed = (why: string) => invalid('malformed_message', `The message is malformed: ${why}`);

/** The packets of an armored key block (armorKey's, or OpenPGP.js's); header lines and the CRC24 line are skipped. */
export function dearmorKey(text: string): Buffer {
  const lines = text.split(/\r?\n/).map((l) => l.trim());
  const begin = lines.findIndex((l) => /^-----BEGIN PGP (PUBLIC|PRIVATE) KEY BLOCK-----$/.test(l));
  const end = lines.findIndex((l, i) => i > begin && l.startsWith('-----END PGP '));
  if (begin < 0 || end < 0) throw invalid('invalid_key', 'Not an armored OpenPGP key block.');
  const body = lines.slice(begin + 1, end);
  const blank = body.indexOf('');
  const data = (blank >= 0 ? body.slice(blank + 1) : body.filter((l) => !/^[\x21-\x39\x3b-\x7e]+: /.test(l))).filter((l) => l && !l.startsWith('='));
  return Buffer.from(data.join(''), 'base64');
}

/**
 * Decodes ASCII armor with Node's base64 (OpenPGP.js decodes in JS, ~3× slower). Header lines are
 * skipped and the CRC24 line is ignored, as RFC 9580 §6.1 requires of receivers (the MDC or AEAD tag
 * protects the data). Stops at the END line: anything after the first message is not read.
 */
export async function* dearmor(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<Uint8Array> {
  let state = 'begin' as 'begin' | 'headers' | 'body';
  let partial = ''; // an incomplete last line
  let base64 = ''; // body characters not yet decoded (fewer than 4 after each step)
  const take = (line: string): boolean => {
    const text = line.trim();
    if (state === 'begin') {
      if (text === '') return false;
      if (text !== '-----BEGIN PGP MESSAGE-----') throw malformed(`armor is not a PGP MESSAGE (${text.slice(0, 40)})`);
      state = 'headers';
      return false;
    }
    if (state === 'headers') {
      if (text === '') state = 'body';
      else if (!/^[\x21-\x39\x3b-\x7e]+: /.test(text)) {
        state = 'body'; // tolerate a missing blank line after the headers
        return take(line);
      }
      return false;
    }
    if (text.startsWith('-----END PGP MESSAGE-----')) return true;
    if (/^=[A-Za-z0-9+/]{4}$/.test(text)) return false; // CRC24
    addBase64(text);
    return false;
  };
  const addBase64 = (lines: string) => {
    if (/[^A-Za-z0-9+/=\n]/.test(lines)) {
      lines = lines.replace(/[ \t\r]+/g, ''); // CRLF or stray blanks: the slow path
      if (/[^A-Za-z0-9+/=\n]/.test(lines)) throw malformed('invalid character in armor');
    }
    base64 += lines;
    digits += lines.length - countNewlines(lines);
  };
  let digits = 0; // base64 digits in `base64`, which also holds newlines (Node's decoder skips them)
  const decoded = (final: boolean): Uint8Array | null => {
    let cut = base64.length;
    let carry = '';
    if (!final && digits % 4) {
      // Keep the last digits % 4 digits for the next round: decode whole quads only.
      let keep = digits % 4;
      while (keep) if (base64[--cut] !== '\n') keep--;
      carry = base64.slice(cut).replaceAll('\n', '');
    } else if (final && digits % 4 === 1) throw malformed('armor body is cut short');
    const text = base64.slice(0, cut);
    base64 = carry;
    digits = carry.length;
    if (!text) return null;
    const bytes = Buffer.from(text, 'base64');
    return bytes.length ? new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength) : null;
  };
  for await (const chunk of chunks) {
    let text = partial + Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength).toString('latin1');
    if (state === 'body') {
      // Fast path: all whole lines up to one starting with '=' (CRC or wrapped padding) or '-' (END).
      const stop = text.search(/(?:^|\n)[-=]/);
      const end = stop >= 0 ? stop : text.lastIndexOf('\n');
      if (end > 0) {
        addBase64(text.slice(0, end));
        text = text.slice(end);
      }
    }
    const lines = text.split('\n');
    partial = lines.pop() ?? '';
    if (partial.length > 1 << 20 && state !== 'body') throw malformed('armor header line too long');
    // A long body line that is not plain base64 would be re-read with every chunk (quadratic).
    if (partial.length > MAX_ARMOR_LINE && !/^[A-Za-z0-9+/]+$/.test(partial)) throw malformed('armor line too long');
    for (const line of lines) {
      if (take(line)) {
        const last = decoded(true);
        if (last) yield last;
        return;
      }
    }
    // Armor without line breaks: decode what cannot be part of the END line yet.
    if (state === 'body' && partial.length > 1 << 16 && /^[A-Za-z0-9+/]+$/.test(partial)) {
      addBase64(partial);
      partial = '';
    }
    const bytes = decoded(false);
    if (bytes) yield bytes;
  }
  if (partial && take(partial)) {
    const last = decoded(true);
    if (last) yield last;
    return;
  }
  throw malformed('armor has no END line (truncated?)');
}

function countNewlines(text: string): number {
  let n = 0;
  for (let i = text.indexOf('\n'); i >= 0; i = text.indexOf('\n', i + 1)) n++;
  return n;
}

/**
 * Whether a message is armored, from its first octet that is not white space (within its first 64 KiB):
 * a '-' begins `-----BEGIN PGP MESSAGE-----`. `empty`: no such octet. `chunks` replays the input whole.
 */
export async function sniffArmor(input: AsyncIterable<Buffer>): Promise<{ armored: boolean; empty: boolean; chunks: AsyncGenerator<Buffer> }> {
  const it = input[Symbol.asyncIterator]();
  const head: Buffer[] = [];
  let first: number | undefined;
  for (let seen = 0; first === undefined && seen < 64 * 1024;) {
    const next = await it.next();
    if (next.done) break;
    head.push(next.value);
    seen += next.value.length;
    first = next.value.find((b) => b !== 0x20 && b !== 0x09 && b !== 0x0a && b !== 0x0d);
  }
  async function* chunks(): AsyncGenerator<Buffer> {
    yield* head;
    for (let next = await it.next(); !next.done; next = await it.next()) yield next.value;
  }
  return { armored: first === 0x2d, empty: first === undefined, chunks: chunks() };
}
