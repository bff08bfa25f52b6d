import * as crypto from 'node:crypto';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createDeflate } from 'node:zlib';
import * as openpgp from 'openpgp';
import { AppError, invalid } from '../errors';
import { ONE_PIECE } from '../streams';
import { armorMessage } from './armor';
import { AES_ECB, cfbDecryptor } from './cfb';
import { type Content, type ContentOptions, readContent } from './content';
import { CHUNK_BYTES, Pull, body, header, lengthOctets, malformed, packet, sessionKeyPackets } from './packets';
import { sessionKeyPacket } from './pkesk';
import { afterDecryption, integrityFailure } from './integrity';
import { MAX_SESSION_KEY_TRIES, SESSION_KEY_CONFIG, checkSessionKeyPackets, sessionKeyPacketsFor, sessionKeyV1 } from './session';
import { isPqcPrivateKey, type StoredPrivateKey } from './keys';
import { openPqcSessionKeyPacket, pqcRecipientKeyId } from './v6/kem';
import type { UnlockedV6Key } from './v6/read-key';
import { errMessage } from './thrown';
import type { Watch } from './watch';

/**
 * SEIPDv1 (RFC 9580 §5.13.1, "MDC") encryption on Node's own AES-256-CFB and SHA-1 (OpenSSL), for a v4
 * recipient (unsigned; binary or armored, compressed with Node's zlib or not). OpenPGP.js still makes the
 * session-key packet (public-key crypto); only the bulk data is done here, streaming in 1 MiB packets,
 * several times faster than OpenPGP.js's JavaScript AES and with flat, small memory. The output is the
 * same message format gpg 2.2, Sequoia and OpenPGP.js read (tests check all three).
 */

const TAG_COMPRESSED = 8;
const TAG_LITERAL = 11;
const TAG_SEIPD = 18;
const ZLIB = 2;
/** gpg's default level. */
const ZLIB_LEVEL = 6;
const MDC_HEADER = Buffer.from([0xd3, 0x14]); // new-format packet 19, length 20

/** Whether encryptNative can write to this recipient (else the caller uses OpenPGP.js). */
export function nativeEncryptable(recipient: openpgp.PublicKey): boolean {
  return recipient.keyPacket.version === 4;
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
    while (this.size >= CHUNK_BYTES) {
      out.push(this.header(Buffer.from([224 + 20])));
      for (let need = CHUNK_BYTES; need > 0;) {
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
      this.size -= CHUNK_BYTES;
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

/** `compress`: the literal data in a zlib Compressed Data packet; `armor`: ASCII armor around the message. */
export async function encryptNative(
  input: Readable,
  recipient: openpgp.PublicKey,
  opts: { filename?: string; date?: Date; compress: boolean; armor: boolean },
): Promise<Readable> {
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

  const date = Buffer.alloc(4);
  date.writeUInt32BE(Math.floor((opts.date ?? new Date()).getTime() / 1000));
  async function* literalPacket(): AsyncGenerator<Buffer> {
    const literal = new PacketWriter(TAG_LITERAL);
    yield* literal.push(Buffer.concat([Buffer.from([0x62, filename.length]), filename, date])); // 'b'inary
    for await (const chunk of input) yield* literal.push(chunk as Buffer);
    yield* literal.end();
  }
  async function* compressedPacket(): AsyncGenerator<Buffer> {
    const compressed = new PacketWriter(TAG_COMPRESSED);
    yield* compressed.push(Buffer.from([ZLIB]));
    const deflate = createDeflate({ level: ZLIB_LEVEL, chunkSize: CHUNK_BYTES / 4 });
    pipeline(Readable.from(literalPacket(), ONE_PIECE), deflate).catch(() => {}); // an input error reaches `deflate`'s reader
    for await (const c of deflate) yield* compressed.push(c as Buffer);
    yield* compressed.end();
  }

  async function* message(): AsyncGenerator<Buffer> {
    yield Buffer.from(pkesk);
    const seipd = new PacketWriter(TAG_SEIPD);
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
    for await (const piece of opts.compress ? compressedPacket() : literalPacket()) yield* seal([piece]);
    yield* seal([MDC_HEADER]); // the MDC covers its own two header octets…
    yield* seal([mdc.digest()], false); // …but not the hash
    const tail = cipher.final();
    if (tail.length) yield* seipd.push(tail);
    yield* seipd.end();
  }

  // An input error ends the generator with that error, which destroys the output with it.
  return Readable.from(opts.armor ? armorMessage(message()) : message(), ONE_PIECE);
}

// ---------------------------------------------------------------------------------------- decrypt

/** A message opened up to its encrypted data: the recipients named, then decryption as a stream. */
export interface OpenedPackets {
  /** Lowercase hex key ids the message is encrypted to (pkesk.ts's WILDCARD_KEY_ID for a hidden recipient). */
  encryptionKeyIds: string[];
  /** Call once. Errors before decryption begins: 422 no_matching_key, unsupported_message, malformed_message. */
  decrypt(privateKey: StoredPrivateKey): Promise<Decrypted>;
}

/** Decrypted content; its errors are classified by `failed` (integrity.ts: one answer once decryption has begun). */
export interface Decrypted extends Content {
  failed(err: unknown): Error;
}

/** AES key sizes by OpenPGP cipher id (RFC 9580 §9.3). */
const AES_BITS: Record<number, number> = { 7: 128, 8: 192, 9: 256 };
/** AEAD modes by id (RFC 9580 §9.6) Node's OpenSSL runs: OCB (the one every implementation has) and GCM. */
const AEAD: Record<number, { name: 'ocb' | 'gcm'; nonce: number }> = { 2: { name: 'ocb', nonce: 15 }, 3: { name: 'gcm', nonce: 12 } };
const AEAD_NAMES: Record<number, string> = { 1: 'EAX' };
const TAG = 16;
/** RFC 9580 §5.13.2: chunks of 2^(c+6) octets, c at most 16. */
const MAX_CHUNK_SIZE_BYTE = 16;

const unsupported = (why: string) => invalid('unsupported_message', `This message cannot be decrypted here: ${why}.`);

/**
 * Opens a binary message: session key packets (public-key ones for us; password ones are passed over),
 * then one SEIPD packet, decrypted on Node's crypto: version 1 (AES in CFB with its MDC: cfb.ts, SHA-1)
 * or version 2 (AES in OCB or GCM chunks, RFC 9580 §5.13.2). Other formats are refused before any
 * decryption: data not integrity protected (SED), the draft AEAD packet, legacy ciphers (RFC 9580 §9.3
 * makes decrypting them a MAY) and EAX. What the encrypted data holds is read by content.ts.
 *
 * SEIPDv1 plaintext flows out before the MDC at the end has been checked; SEIPDv2 plaintext chunk by
 * chunk, each authenticated, before the final tag. A failed check errors the data at its end: the caller
 * holds back the last chunk until then.
 */
export async function openNative(input: Readable, opts: ContentOptions & { signal?: AbortSignal }): Promise<OpenedPackets> {
  const p = new Pull(input[Symbol.asyncIterator]());
  let pkesks: Buffer[];
  let pqcPackets: { keyId: string; body: Buffer }[];
  let seipd: Awaited<ReturnType<typeof header>>;
  try {
    const { packets, next } = await sessionKeyPackets(p);
    const publicKeyPackets = packets.filter((k) => k.tag === 1); // password packets: not ours to try
    pkesks = publicKeyPackets.map((k) => packet(1, k.body));
    // Post-quantum ones (RFC 9980), which OpenPGP.js does not read, are opened by v6/kem.ts.
    pqcPackets = publicKeyPackets.flatMap((k) => {
      const keyId = pqcRecipientKeyId(k.body);
      return keyId ? [{ keyId, body: k.body }] : [];
    });
    if (next === 9) throw unsupported('its data is not integrity protected (SED)');
    if (next === 20) throw unsupported('it uses the draft AEAD packet; SEIPD packets are read');
    if (next === null) throw malformed('it has no encrypted data');
    if (next < 0) throw malformed('bad packet header');
    if (next !== 18) throw malformed(pkesks.length ? `a packet of type ${next} before the encrypted data` : 'it is not encrypted to a public key');
    if (!pkesks.length) throw malformed('it is not encrypted to a public key');
    seipd = await header(p);
  } catch (err) {
    input.destroy();
    throw p.failed ?? err; // a storage error is not a judgement on the message, and is retried
  }
  const data = new Pull(body(p, seipd.length));
  let head: SeipdHead;
  let message: openpgp.Message<Uint8Array>;
  try {
    head = await seipdHead(data);
    message = await opts.watch.call(openpgp.readMessage({ binaryMessage: Buffer.concat(pkesks) }));
  } catch (err) {
    input.destroy();
    throw p.failed ?? opts.watch.failure ?? (err instanceof AppError ? err : malformed(errMessage(err)));
  }
  let used = false;
  return {
    encryptionKeyIds: [...new Set([...message.getEncryptionKeyIDs().map((id) => id.toHex()), ...pqcPackets.map((k) => k.keyId)])],
    async decrypt(privateKey) {
      if (used) throw new Error('decrypt() can be called once');
      if (!isPqcPrivateKey(privateKey) && !privateKey.isDecrypted()) throw new Error('decrypt needs an unlocked private key');
      used = true;
      let plaintext: AsyncIterable<Buffer>;
      try {
        if (isPqcPrivateKey(privateKey)) {
          // A v6 session key packet goes with SEIPDv2 only (RFC 9580 §5.1).
          if (head.version !== 2) throw invalid('no_matching_key', 'The message is not encrypted to this key.');
          plaintext = await decryptV2(data, head, pqcSessionKey(pqcPackets, privateKey));
        } else {
          if (!sessionKeyPacketsFor(message, privateKey).length) throw invalid('no_matching_key', 'The message is not encrypted to this key.');
          plaintext =
            head.version === 1
              ? await decryptV1(data, message, privateKey, opts.watch)
              : await decryptV2(data, head, await sessionKeyV2(message, privateKey, head, opts.watch));
        }
      } catch (err) {
        input.destroy();
        throw p.failed ?? opts.watch.failure ?? (err instanceof AppError ? err : invalid('no_matching_key', 'The message cannot be decrypted with this key.'));
      }
      // Decryption has begun: from here on a failure answers integrity.ts's one error, whatever failed.
      const failed = (err: unknown) => {
        input.destroy(); // stop reading the file
        return afterDecryption(err, { inputError: p.failed, signal: opts.signal });
      };
      async function* ended(): AsyncGenerator<Buffer> {
        yield* plaintext;
        if (await p.fill(1)) throw malformed('data after the encrypted packet');
      }
      try {
        return { ...(await readContent(new Pull(ended()[Symbol.asyncIterator]()), opts)), failed };
      } catch (err) {
        throw failed(err);
      }
    },
  };
}

type SeipdHead = { version: 1 } | { version: 2; cipher: number; aead: number; chunkSizeByte: number; salt: Buffer };

/** The unencrypted start of a SEIPD packet's body; formats we do not decrypt are refused here. */
async function seipdHead(data: Pull): Promise<SeipdHead> {
  const version = (await data.take(1))[0];
  if (version === 1) return { version };
  if (version !== 2) throw unsupported(`a version ${version} encrypted data packet`);
  const [cipher, aead, chunkSizeByte] = await data.take(3);
  if (!AES_BITS[cipher]) throw unsupported(`its cipher is ${openpgp.enums.read(openpgp.enums.symmetric, cipher) ?? cipher}, not AES`);
  if (!AEAD[aead]) throw unsupported(`its AEAD mode is ${AEAD_NAMES[aead] ?? aead} (OCB and GCM are read)`);
  if (chunkSizeByte > MAX_CHUNK_SIZE_BYTE) throw malformed(`AEAD chunks of 2^${chunkSizeByte + 6} octets (at most 2^22)`);
  return { version, cipher, aead, chunkSizeByte, salt: await data.take(32) };
}

/** SEIPDv1: AES-CFB over a random prefix, the content and an MDC packet (SHA-1 of all before it), checked at the end. */
async function decryptV1(data: Pull, message: openpgp.Message<Uint8Array>, privateKey: openpgp.PrivateKey, watch: Watch): Promise<AsyncIterable<Buffer>> {
  const sessionKey = await watch.call(sessionKeyV1(message, privateKey));
  const ecb = AES_ECB[sessionKey.algorithm];
  if (!ecb) throw unsupported(`its cipher is ${sessionKey.algorithm}, not AES`);
  const cfb = cfbDecryptor(ecb, Buffer.from(sessionKey.data));
  const mdc = crypto.createHash('sha1');
  async function* plaintext(): AsyncGenerator<Buffer> {
    for await (const c of data.drain()) yield* cfb.update(c);
  }
  // Everything but the random prefix and the trailing MDC packet (22 octets), which is checked at the end.
  // The prefix's repeated octets ("quick check") are not consulted: RFC 9580 §14.4 warns against acting
  // on them (an oracle); the MDC, which covers the prefix, decides.
  async function* verified(): AsyncGenerator<Buffer> {
    let prefix = 18;
    let tail: Buffer = Buffer.alloc(0);
    for await (let c of plaintext()) {
      if (prefix) {
        const cut = Math.min(prefix, c.length);
        mdc.update(c.subarray(0, cut));
        prefix -= cut;
        c = c.subarray(cut);
      }
      const all = tail.length + c.length;
      if (all <= 22) {
        tail = Buffer.concat([tail, c]);
        continue;
      }
      const cut = all - 22;
      const out = cut >= tail.length ? [tail, c.subarray(0, cut - tail.length)] : [tail.subarray(0, cut)];
      tail = cut >= tail.length ? c.subarray(cut - tail.length) : Buffer.concat([tail.subarray(cut), c]);
      for (const o of out) {
        if (!o.length) continue;
        mdc.update(o);
        yield o;
      }
    }
    if (prefix || tail.length !== 22 || tail[0] !== 0xd3 || tail[1] !== 0x14) throw integrityFailure();
    mdc.update(tail.subarray(0, 2));
    if (!crypto.timingSafeEqual(mdc.digest(), tail.subarray(2))) throw integrityFailure();
  }
  return verified();
}

/**
 * SEIPDv2: HKDF-SHA256 of the session key gives the message key and nonce prefix; each chunk is opened
 * with its index as the nonce's last 8 octets, and a final tag covers the total length (RFC 9580 §5.13.2).
 */
/**
 * The session key of a SEIPDv2 message from OpenPGP.js, for the AES size the encrypted data names (in
 * constant-time mode an RSA packet yields one candidate per size).
 */
async function sessionKeyV2(message: openpgp.Message<Uint8Array>, privateKey: openpgp.PrivateKey, head: Extract<SeipdHead, { version: 2 }>, watch: Watch) {
  checkSessionKeyPackets(message, privateKey);
  const keys = await watch.call(openpgp.decryptSessionKeys({ message, decryptionKeys: privateKey, config: SESSION_KEY_CONFIG }));
  const sessionKey = keys.find((k) => k.data.length === AES_BITS[head.cipher] / 8);
  if (!sessionKey) throw invalid('no_matching_key', 'The message cannot be decrypted with this key.');
  return sessionKey.data;
}

/** The session key of a message to a post-quantum key: the first of at most MAX_SESSION_KEY_TRIES packets that opens (each opening is silent). */
function pqcSessionKey(packets: { body: Buffer }[], privateKey: UnlockedV6Key): Uint8Array {
  if (packets.length > MAX_SESSION_KEY_TRIES)
    throw invalid('malformed_message', `The message has ${packets.length} session key packets for this key (at most ${MAX_SESSION_KEY_TRIES} are tried).`);
  for (const k of packets) {
    const opened = openPqcSessionKeyPacket(k.body, privateKey);
    if (opened) return opened;
  }
  throw invalid('no_matching_key', 'The message cannot be decrypted with this key.');
}

/**
 * SEIPDv2: HKDF-SHA256 of the session key gives the message key and nonce prefix; each chunk is opened
 * with its index as the nonce's last 8 octets, and a final tag covers the total length (RFC 9580 §5.13.2).
 */
async function decryptV2(data: Pull, head: Extract<SeipdHead, { version: 2 }>, sessionKeyData: Uint8Array): Promise<AsyncIterable<Buffer>> {
  const bits = AES_BITS[head.cipher];
  if (sessionKeyData.length !== bits / 8) throw invalid('no_matching_key', 'The message cannot be decrypted with this key.');
  const sessionKey = { data: sessionKeyData };
  const mode = AEAD[head.aead];
  const info = Buffer.from([0xc0 | 18, 2, head.cipher, head.aead, head.chunkSizeByte]);
  const derived = Buffer.from(crypto.hkdfSync('sha256', sessionKey.data, head.salt, info, bits / 8 + mode.nonce - 8));
  const key = derived.subarray(0, bits / 8);
  const noncePrefix = derived.subarray(bits / 8);
  const algorithm = `aes-${bits}-${mode.name}` as crypto.CipherGCMTypes;
  const open = (index: number, sealed: Buffer, ad: Buffer): Buffer => {
    const nonce = Buffer.alloc(mode.nonce);
    noncePrefix.copy(nonce);
    nonce.writeBigUInt64BE(BigInt(index), mode.nonce - 8);
    const decipher = crypto.createDecipheriv(algorithm, key, nonce, { authTagLength: TAG });
    decipher.setAAD(ad);
    decipher.setAuthTag(sealed.subarray(sealed.length - TAG));
    const out = decipher.update(sealed.subarray(0, sealed.length - TAG));
    try {
      return Buffer.concat([out, decipher.final()]);
    } catch {
      throw integrityFailure();
    }
  };
  const chunk = 2 ** (head.chunkSizeByte + 6);
  async function* chunks(): AsyncGenerator<Buffer> {
    let index = 0;
    let total = 0;
    // A full chunk while more than a final tag follows it; then the last chunk (if any) and the final tag.
    while (await data.fill(chunk + 2 * TAG)) {
      yield open(index++, await data.take(chunk + TAG, chunk + TAG), info);
      total += chunk;
    }
    const rest = data.buffered;
    if (rest < TAG || (index === 0 && rest < 2 * TAG) || (rest > TAG && rest < 2 * TAG)) throw integrityFailure();
    if (rest >= 2 * TAG) {
      const last = open(index++, await data.take(rest - TAG, chunk + TAG), info);
      total += last.length;
      if (last.length) yield last;
    }
    const length = Buffer.alloc(8);
    length.writeBigUInt64BE(BigInt(total));
    open(index, await data.take(TAG), Buffer.concat([info, length]));
  }
  return chunks();
}
