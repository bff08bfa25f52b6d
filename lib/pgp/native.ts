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
import { type Aead, sessionKeyPacket } from './pkesk';
import { afterDecryption, integrityFailure } from './integrity';
import { MAX_SESSION_KEY_TRIES, sessionKeyPacketsFor, sessionKeyV1, sessionKeyV2 } from './session';
import { isPqcPrivateKey, type StoredPrivateKey } from './keys';
import { openPqcSessionKeyPacket, pqcPacketRecipient, pqcSessionKeyPacket } from './v6/kem';
import type { UnlockedV6Key, V6Key } from './v6/read-key';
import { errMessage } from './thrown';

/**
 * Encryption on Node's own crypto (OpenSSL), unsigned, binary or armored, compressed with Node's zlib or
 * not, streaming in 1 MiB packets with flat, small memory, several times faster than OpenPGP.js's
 * JavaScript AES. Two formats, by the recipient key (`messageFormat`):
 * - SEIPDv1 (RFC 9580 §5.13.1, "MDC"): AES-256-CFB and SHA-1, for a v4 recipient that does not advertise
 *   SEIPDv2 (ours, gpg's, sq's): what gpg 2.2, Sequoia and OpenPGP.js read (tests check all three);
 * - SEIPDv2 (RFC 9580 §5.13.2): AES-256 in OCB or GCM chunks, for a v6 recipient or one whose features
 *   list SEIPDv2, with v6 session key packets.
 * The session key packets are made by a function (`SessionKeyPackets`): pkesk.ts's for the key types
 * OpenPGP.js reads, another module's for a key it does not.
 */

const TAG_COMPRESSED = 8;
const TAG_LITERAL = 11;
const TAG_SEIPD = 18;
const ZLIB = 2;
/** gpg's default level. */
const ZLIB_LEVEL = 6;
const MDC_HEADER = Buffer.from([0xd3, 0x14]); // new-format packet 19, length 20
const AES256 = 9;

/** A message's data format: SEIPDv1, or SEIPDv2 with its AEAD mode (AES-256 either way). */
export type MessageFormat = { seipd: 1 } | { seipd: 2; aead: Aead };

/** The framed session key packets of a message under `sessionKey` (32 octets, AES-256) in `format`. */
export type SessionKeyPackets = (sessionKey: Buffer, format: MessageFormat) => Promise<Uint8Array>;

/** Whether encryptNative can write to this recipient (else the caller uses OpenPGP.js). */
export function nativeEncryptable(recipient: openpgp.PublicKey): boolean {
  return recipient.keyPacket.version === 4 || recipient.keyPacket.version === 6;
}

/** What a recipient key's self-signature says a sender may use (RFC 9580 §5.2.3). */
export interface RecipientPreferences {
  features?: number[] | null;
  preferredCipherSuites?: [number, number][] | null;
  preferredCompressionAlgorithms?: number[] | null;
}

/**
 * The preferences of `recipient`: a v6 key keeps them in its direct-key signature, a v4 key in its primary
 * user's self-signature (OpenPGP.js picks; the method is untyped). Undefined without a valid one.
 */
export async function recipientPreferences(recipient: openpgp.PublicKey): Promise<RecipientPreferences | undefined> {
  try {
    return await (recipient as unknown as { getPrimarySelfSignature(): Promise<RecipientPreferences> }).getPrimarySelfSignature();
  } catch {
    return undefined; // encrypting fails on the key itself, not here
  }
}

/** The Features subpacket's SEIPDv2 flag (RFC 9580 §5.2.3.32). */
const FEATURE_SEIPDV2 = 0x08;

/**
 * SEIPDv2 for a v6 key and for a key whose features list it (RFC 9580 §5.2.3.32), else SEIPDv1. The AEAD
 * mode is the first OCB or GCM one in the key's preferred cipher suites (RFC 9580 §5.2.3.15), else OCB,
 * the one RFC 9580 makes every implementation support.
 */
export async function messageFormat(recipient: openpgp.PublicKey): Promise<MessageFormat> {
  const self = await recipientPreferences(recipient);
  const v2 = recipient.keyPacket.version === 6 || Boolean((self?.features?.[0] ?? 0) & FEATURE_SEIPDV2);
  return v2 ? { seipd: 2, aead: aeadOf(self?.preferredCipherSuites ?? []) } : { seipd: 1 };
}

/** The first OCB or GCM mode among a key's preferred cipher suites, else OCB. */
const aeadOf = (suites: readonly (readonly [number, number])[]): Aead =>
  suites.find(([, aead]) => aead === AEAD_IDS.ocb || aead === AEAD_IDS.gcm)?.[1] === AEAD_IDS.gcm ? 'gcm' : 'ocb';

/**
 * Writes one packet of unknown length: full pieces (`piece` octets, a power of 2, 1 MiB by default) with
 * partial-length headers as the body grows, and the rest with a definite length at the end.
 */
class PacketWriter {
  private pieces: Buffer[] = [];
  private size = 0;
  private started = false;
  private readonly lengthOctet: Buffer;

  constructor(
    private readonly tag: number,
    private readonly piece = CHUNK_BYTES,
  ) {
    this.lengthOctet = Buffer.from([224 + Math.log2(piece)]);
  }

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
    while (this.size >= this.piece) {
      out.push(this.header(this.lengthOctet));
      for (let need = this.piece; need > 0;) {
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
      this.size -= this.piece;
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

export interface EncryptNativeOptions {
  filename?: string;
  date?: Date;
  /** The literal data in a zlib Compressed Data packet. */
  compress: boolean;
  /** ASCII armor around the message. */
  armor: boolean;
}

/** Encrypts `input` to `recipient` in the format its key asks for (`messageFormat`), session key packet by pkesk.ts. */
export async function encryptNative(input: Readable, recipient: openpgp.PublicKey, opts: EncryptNativeOptions): Promise<Readable> {
  const format = await messageFormat(recipient);
  const packets: SessionKeyPackets = (sessionKey, f) => sessionKeyPacket(recipient, 'aes256', sessionKey, f.seipd === 2 ? f.aead : undefined);
  return encryptWith(input, packets, format, opts);
}

/**
 * Encrypts `input` to a post-quantum key (RFC 9980), which OpenPGP.js does not read: PKESK v6 from
 * v6/kem.ts (ML-KEM-768 + X25519), then SEIPDv2 in the AEAD mode the key prefers (aeadOf). An expired or
 * revoked key, or one without a valid encryption subkey, is 422 no_encryption_key.
 */
export async function encryptPqc(input: Readable, recipient: V6Key, opts: EncryptNativeOptions): Promise<Readable> {
  const packets: SessionKeyPackets = async (sessionKey) => pqcSessionKeyPacket(recipient, sessionKey);
  return encryptWith(input, packets, { seipd: 2, aead: aeadOf(recipient.preferences.aead) }, opts);
}

/**
 * Encrypts `input` under a fresh AES-256 session key in `format`, its session key packets made by
 * `sessionKeyPackets` (a failure there is 422 no_encryption_key). An input error ends the output with it.
 */
export async function encryptWith(input: Readable, sessionKeyPackets: SessionKeyPackets, format: MessageFormat, opts: EncryptNativeOptions): Promise<Readable> {
  const filename = Buffer.from(opts.filename ?? '', 'utf8');
  if (filename.length > 255) throw invalid('invalid_filename', 'The file name must be at most 255 bytes of UTF-8.');
  const sessionKey = crypto.randomBytes(32);
  let pkesk: Uint8Array;
  try {
    pkesk = await sessionKeyPackets(sessionKey, format);
  } catch (err) {
    input.destroy();
    if (err instanceof AppError) throw err; // already says why (v6/kem.ts)
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
  const content = opts.compress ? compressedPacket() : literalPacket();
  async function* message(): AsyncGenerator<Buffer> {
    yield Buffer.from(pkesk);
    yield* format.seipd === 1 ? sealV1(sessionKey, content) : sealV2(sessionKey, format.aead, content);
  }
  // An input error ends the generator with that error, which destroys the output with it.
  return Readable.from(opts.armor ? armorMessage(message()) : message(), ONE_PIECE);
}

/** A SEIPDv1 packet: AES-256-CFB (zero IV, no resync) over a random prefix, the content and its MDC (SHA-1). */
async function* sealV1(sessionKey: Buffer, content: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
  const seipd = new PacketWriter(TAG_SEIPD);
  const cipher = crypto.createCipheriv('aes-256-cfb', sessionKey, Buffer.alloc(16));
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
  for await (const piece of content) yield* seal([piece]);
  yield* seal([MDC_HEADER]); // the MDC covers its own two header octets…
  yield* seal([mdc.digest()], false); // …but not the hash
  const tail = cipher.final();
  if (tail.length) yield* seipd.push(tail);
  yield* seipd.end();
}

/**
 * Chunks of 2^(WRITE_CHUNK_SIZE_BYTE + 6) octets (256 KiB, OpenPGP.js's default too): a reader holds one
 * chunk's plaintext until its tag checks, and each chunk costs a cipher context and a tag. Decrypting
 * 1 MiB chunks ran at 1.2 × SEIPDv1 against 2.1–2.4 × for 256 KiB ones (bench `shapes`, 256 MiB, the same
 * reader): a chunk larger than the reader's 256 KiB pieces is held across several reads.
 */
const WRITE_CHUNK_SIZE_BYTE = 12;
/**
 * The SEIPDv2 packet's partial-length pieces: 256 KiB. In 1 MiB pieces, as long as the chunks, every
 * piece's header fell inside a chunk and a reader's file reads cut each chunk once more: decryption
 * cost ~1.5 times the CPU (bench `shapes`, 256 MiB: 0.56–0.61 CPU-s against 0.36–0.44).
 */
const SEIPD_V2_PIECE = 256 * 1024;

/**
 * A SEIPDv2 packet (RFC 9580 §5.13.2): version, cipher, mode, chunk size and a random 32-octet salt, then
 * the content in AEAD chunks, each with its tag, then the final tag over the total length. Each chunk's
 * plaintext goes to OpenSSL as it comes (no copy); its ciphertext out as OpenSSL returns it.
 */
async function* sealV2(sessionKey: Buffer, aead: Aead, content: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
  const seipd = new PacketWriter(TAG_SEIPD, SEIPD_V2_PIECE);
  const head: SeipdV2Head = { version: 2, cipher: AES256, aead: AEAD_IDS[aead], chunkSizeByte: WRITE_CHUNK_SIZE_BYTE, salt: crypto.randomBytes(32) };
  yield* seipd.push(Buffer.concat([Buffer.from([2, head.cipher, head.aead, head.chunkSizeByte]), head.salt]));
  const chunks = chunkKeys(sessionKey, head);
  const size = chunks.size;
  let index = 0;
  let inChunk = 0;
  let total = 0;
  let cipher = chunks.cipher(index);
  const close = () => [...seipd.push(cipher.final()), ...seipd.push(cipher.getAuthTag())];
  for await (const piece of content) {
    for (let at = 0; at < piece.length;) {
      const n = Math.min(size - inChunk, piece.length - at);
      yield* seipd.push(cipher.update(n === piece.length ? piece : piece.subarray(at, at + n)));
      at += n;
      inChunk += n;
      total += n;
      if (inChunk === size) {
        yield* close();
        cipher = chunks.cipher(++index);
        inChunk = 0;
      }
    }
  }
  if (inChunk > 0 || index === 0) {
    yield* close(); // the last chunk, shorter than the others (or the one empty chunk of empty content)
    index++;
  }
  cipher = chunks.cipher(index, total);
  yield* close(); // the final tag: no data, the total length in its associated data
  yield* seipd.end();
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
const AEAD: Record<number, { name: Aead; nonce: number }> = { 2: { name: 'ocb', nonce: 15 }, 3: { name: 'gcm', nonce: 12 } };
const AEAD_IDS: Record<Aead, number> = { ocb: 2, gcm: 3 };
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
  let pqcPackets: { keyId: string; cipher: number | null; body: Buffer }[];
  let seipd: Awaited<ReturnType<typeof header>>;
  try {
    const { packets, next } = await sessionKeyPackets(p);
    const publicKeyPackets = packets.filter((k) => k.tag === 1); // password packets: not ours to try
    pkesks = publicKeyPackets.map((k) => packet(1, k.body));
    // Post-quantum ones (RFC 9980), which OpenPGP.js does not read, are opened by v6/kem.ts.
    pqcPackets = publicKeyPackets.flatMap((k) => {
      const recipient = pqcPacketRecipient(k.body);
      return recipient ? [{ ...recipient, body: k.body }] : [];
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
          // A v6 session key packet goes with SEIPDv2, a v3 one with SEIPDv1 (RFC 9580 §5.1): the other kind is not tried.
          const packets = pqcPackets.filter((k) => (k.cipher === null) === (head.version === 2));
          const sessionKey = pqcSessionKey(packets, privateKey);
          if (head.version === 2) plaintext = await decryptV2(data, head, sessionKey.data);
          else plaintext = await decryptV1(data, sessionKey);
        } else {
          if (!sessionKeyPacketsFor(message, privateKey).length) throw invalid('no_matching_key', 'The message is not encrypted to this key.');
          plaintext =
            head.version === 1
              ? await decryptV1(data, await opts.watch.call(sessionKeyV1(message, privateKey)))
              : await decryptV2(data, head, await opts.watch.call(sessionKeyV2(message, privateKey, AES_BITS[head.cipher] / 8)));
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

interface SeipdV2Head {
  version: 2;
  cipher: number;
  aead: number;
  chunkSizeByte: number;
  salt: Buffer;
}
type SeipdHead = { version: 1 } | SeipdV2Head;

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
async function decryptV1(data: Pull, sessionKey: openpgp.SessionKey): Promise<AsyncIterable<Buffer>> {
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
 * What a SEIPDv2 message's chunks are sealed with (RFC 9580 §5.13.2): HKDF-SHA256 of the session key,
 * salted with the packet's salt, over the packet's five parameter octets (tag, version, cipher, mode,
 * chunk size), gives the message key and the nonce's first octets; chunk i's nonce ends in i (8 octets),
 * and its associated data is those five octets. The final tag's nonce takes the index after the last
 * chunk, and its associated data adds the total plaintext length.
 */
function chunkKeys(sessionKey: Uint8Array, head: SeipdV2Head) {
  const bits = AES_BITS[head.cipher];
  const mode = AEAD[head.aead];
  const info = Buffer.from([0xc0 | TAG_SEIPD, 2, head.cipher, head.aead, head.chunkSizeByte]);
  const derived = Buffer.from(crypto.hkdfSync('sha256', sessionKey, head.salt, info, bits / 8 + mode.nonce - 8));
  const key = crypto.createSecretKey(derived.subarray(0, bits / 8)); // once: a raw key costs a new KeyObject per cipher (~15 µs)
  const noncePrefix = derived.subarray(bits / 8);
  const algorithm = `aes-${bits}-${mode.name}` as crypto.CipherGCMTypes;
  const nonce = (index: number) => {
    const n = Buffer.alloc(mode.nonce);
    noncePrefix.copy(n);
    n.writeBigUInt64BE(BigInt(index), mode.nonce - 8);
    return n;
  };
  const ad = (total?: number) => {
    if (total === undefined) return info;
    const length = Buffer.alloc(8);
    length.writeBigUInt64BE(BigInt(total));
    return Buffer.concat([info, length]);
  };
  return {
    /** Octets of plaintext in a full chunk. */
    size: 2 ** (head.chunkSizeByte + 6),
    /** Chunk `index`'s cipher; with `total`, the final tag's. */
    cipher(index: number, total?: number) {
      const c = crypto.createCipheriv(algorithm, key, nonce(index), { authTagLength: TAG });
      c.setAAD(ad(total));
      return c;
    },
    decipher(index: number, total?: number) {
      const d = crypto.createDecipheriv(algorithm, key, nonce(index), { authTagLength: TAG });
      d.setAAD(ad(total));
      return d;
    },
  };
}

/**
 * The session key of a message to a post-quantum key: the first of at most MAX_SESSION_KEY_TRIES packets
 * that opens (each opening is silent), with the cipher a v3 packet names in the clear (decryptV1 refuses
 * any but AES).
 */
function pqcSessionKey(packets: { cipher: number | null; body: Buffer }[], privateKey: UnlockedV6Key): openpgp.SessionKey {
  if (packets.length > MAX_SESSION_KEY_TRIES)
    throw invalid('malformed_message', `The message has ${packets.length} session key packets for this key (at most ${MAX_SESSION_KEY_TRIES} are tried).`);
  for (const k of packets) {
    const opened = openPqcSessionKeyPacket(k.body, privateKey);
    if (opened) return { data: opened, algorithm: k.cipher ? openpgp.enums.read(openpgp.enums.symmetric, k.cipher) : 'aes256' };
  }
  throw invalid('no_matching_key', 'The message cannot be decrypted with this key.');
}

/**
 * SEIPDv2: chunks opened as their octets arrive, each piece of ciphertext handed to OpenSSL as it is
 * (no copy, no joining into whole chunks), each chunk's plaintext held until its tag checks. The last
 * 2 × 16 octets seen are held back: at the end they are the last chunk's tag and the final tag, which is
 * checked before the last chunk's plaintext is let out. A changed, dropped, reordered, added or cut chunk
 * fails a tag; every failure here is integrity.ts's one answer.
 */
async function decryptV2(data: Pull, head: SeipdV2Head, sessionKey: Uint8Array | undefined): Promise<AsyncIterable<Buffer>> {
  if (sessionKey?.length !== AES_BITS[head.cipher] / 8) throw invalid('no_matching_key', 'The message cannot be decrypted with this key.');
  const chunks = chunkKeys(sessionKey, head);
  const size = chunks.size;
  let index = 0;
  let fed = 0; // ciphertext octets of the current chunk given to its decipher
  let total = 0;
  let decipher = chunks.decipher(0);
  let plain: Buffer[] = [];
  const tag = Buffer.alloc(TAG);
  let tagged = 0; // octets of the current chunk's tag gathered (it follows a full chunk's ciphertext)
  let held = Buffer.alloc(0);
  const check = (d: crypto.DecipherGCM, t: Buffer): Buffer => {
    d.setAuthTag(t);
    try {
      return d.final();
    } catch {
      throw integrityFailure();
    }
  };
  /** Takes octets known to precede the last 32 of the data; returns the plaintext of the chunks they complete. */
  const take = (c: Buffer, out: Buffer[]) => {
    for (let at = 0; at < c.length;) {
      if (fed < size) {
        const n = Math.min(size - fed, c.length - at);
        const p = decipher.update(n === c.length ? c : c.subarray(at, at + n));
        if (p.length) plain.push(p);
        fed += n;
        at += n;
        continue;
      }
      const n = Math.min(TAG - tagged, c.length - at);
      c.copy(tag, tagged, at, at + n);
      tagged += n;
      at += n;
      if (tagged < TAG) continue;
      const last = check(decipher, tag);
      if (last.length) plain.push(last);
      out.push(...plain);
      plain = [];
      total += size;
      decipher = chunks.decipher(++index);
      fed = 0;
      tagged = 0;
    }
  };
  async function* opened(): AsyncGenerator<Buffer> {
    for await (const c of data.drain()) {
      const out: Buffer[] = [];
      if (held.length + c.length <= 2 * TAG) {
        held = Buffer.concat([held, c]);
        continue;
      }
      if (c.length >= 2 * TAG) {
        take(held, out);
        take(c.subarray(0, c.length - 2 * TAG), out);
        held = Buffer.from(c.subarray(c.length - 2 * TAG)); // copied: a small piece must not keep a large read alive
      } else {
        const keep = 2 * TAG - c.length;
        take(held.subarray(0, held.length - keep), out);
        held = Buffer.concat([held.subarray(held.length - keep), c]);
      }
      yield* out;
    }
    // The end: the current chunk (shorter than the others, or empty) and its tag, then the final tag.
    if (held.length < 2 * TAG || tagged) throw integrityFailure();
    const last = check(decipher, held.subarray(0, TAG));
    if (last.length) plain.push(last);
    for (const p of plain) total += p.length;
    const final = chunks.decipher(index + 1, total);
    check(final, held.subarray(TAG));
    yield* plain;
  }
  return opened();
}
