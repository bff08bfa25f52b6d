import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createDeflate, createInflate, createInflateRaw } from 'node:zlib';
import * as openpgp from 'openpgp';
import { AppError, invalid } from '../errors';
import { ONE_PIECE } from '../streams';
import { MAX_SMALL_PACKETS, MIN_PARTIAL, encryptNative, nativeEncryptable, openNative } from './native';
import { SESSION_KEY_CONFIG, checkSessionKeyPackets, sessionKeyPacketsFor, sessionKeyV1 } from './session';
import { afterDecryption, integrityFailure } from './integrity';
import { asError, errMessage } from './thrown';
import { Watch, type WatchOptions } from './watch';
import type { SignatureCheck, VerificationKey, VerificationResult } from './verification';

/**
 * Streaming OpenPGP encryption and decryption with flat memory, whatever the file size.
 *
 * Node streams at the edges, web streams inside (OpenPGP.js rejects Node streams). All adapters here
 * are pull-based: Node 20's own bridges (`Readable.toWeb`, and the CompressionStream/DecompressionStream
 * that OpenPGP.js uses for zlib) count their high-water mark in chunks rather than bytes, so they read
 * ahead without bound (measured: 1.1 GiB RSS compressing, 650 MiB decompressing a 1 GiB file). So zlib
 * goes through Node's zlib streams here, on both sides (see `zlibCompressed`, `installStreamingInflate`).
 * Input messages are de-armored and re-framed before OpenPGP.js parses them (`dearmor`, `reframe`):
 * OpenPGP.js's cost is per chunk, and gpg sends 8 KiB ones.
 */

/** Read size for files and blobs feeding these functions; also the output buffer size. */
export const CHUNK_BYTES = 1 << 20;

const { enums } = openpgp;

// ---------------------------------------------------------------------------------------- encrypt

export interface EncryptStreamOptions extends WatchOptions {
  armor: boolean;
  /** zlib, if the recipient's key lists it (ours do). Off by default: most files are compressed already. */
  compress?: boolean;
  /** Kept in the literal data packet (max 255 UTF-8 bytes). */
  filename?: string;
  /** Literal packet date; defaults to now. */
  date?: Date;
  /** Signs too (sign-then-encrypt: one-pass signature inside the encryption, hashed as bytes flow). */
  signingKey?: openpgp.PrivateKey;
}

/**
 * Encrypts `input` to `recipient`. For v4 keys without the SEIPDv2 feature flag (ours, gpg's, sq's)
 * the output is SEIPDv1 (MDC) with AES-256, which gpg 2.2 and sq read. Errors on the returned stream:
 * the input's own error unchanged, anything else as it comes. An unusable key is 422 `no_encryption_key`.
 * `signal` aborts (its reason; the input is destroyed); `idleMs` (default 30 s) bounds how long
 * OpenPGP.js may move no bytes while we wait on it (422 `malformed_message`).
 */
export async function encryptStream(input: Readable, recipient: openpgp.PublicKey, opts: EncryptStreamOptions): Promise<Readable> {
  const watch = new Watch(input, opts);
  watch.check();
  if (!opts.signingKey && nativeEncryptable(recipient, opts)) {
    // Node's crypto cannot stall; only the signal applies.
    const out = await watch.call(encryptNative(input, recipient, opts));
    watch.onFail((err) => out.destroy(err));
    out.once('close', () => watch.close());
    return out;
  }
  const filename = opts.filename ?? '';
  if (Buffer.byteLength(filename) > 255) {
    watch.close();
    throw invalid('invalid_filename', 'The file name must be at most 255 bytes of UTF-8.');
  }
  const source = new NodeSource(input, watch);
  let message = await openpgp.createMessage({ binary: source.open(), filename, format: 'binary', date: opts.date });
  if (opts.compress && (await acceptsZlib(recipient))) message = zlibCompressed(message);
  const config: openpgp.PartialConfig = {
    aeadProtect: false,
    preferredSymmetricAlgorithm: enums.symmetric.aes256,
    // Only used if a recipient key advertises SEIPDv2: GCM (~165 MiB/s), not OCB (~2 MiB/s), if it allows.
    preferredAEADAlgorithm: enums.aead.gcm,
    // Compression, if wanted, was done above.
    preferredCompressionAlgorithm: enums.compression.uncompressed,
  };
  let out: WebStream;
  try {
    const base = { message, encryptionKeys: recipient, config, ...(opts.signingKey ? { signingKeys: opts.signingKey } : {}) };
    out = opts.armor ? await watch.call(openpgp.encrypt({ ...base, format: 'armored' })) : await watch.call(openpgp.encrypt({ ...base, format: 'binary' }));
  } catch (err) {
    input.destroy();
    watch.close();
    if (watch.failure) throw watch.failure;
    if (/encryption key|expired|revoked/i.test(errMessage(err))) {
      throw invalid('no_encryption_key', `Cannot encrypt to this key: ${errMessage(err)}`);
    }
    throw err;
  }
  return new WebSource(out, (err) => watch.failure ?? source.failure ?? asError(err), false, watch);
}

/** Recipients that do not list zlib get uncompressed data (only "uncompressed" is a MUST in RFC 9580). */
async function acceptsZlib(recipient: openpgp.PublicKey): Promise<boolean> {
  try {
    const { selfCertification } = await recipient.getPrimaryUser();
    return selfCertification.preferredCompressionAlgorithms?.includes(enums.compression.zlib) ?? false;
  } catch {
    return false;
  }
}

/** gpg's default level. On incompressible data Node's zlib runs at ~40 MiB/s at level 6 here. */
const ZLIB_LEVEL = 6;
const ZLIB_CHUNK = 256 * 1024;

/** Fields of OpenPGP.js's CompressedDataPacket that its type declarations keep private. */
interface CompressedPacketFields {
  algorithm: openpgp.enums.compression;
  packets: openpgp.PacketList<openpgp.AnyPacket>;
  compressed: unknown;
  decompress: (this: CompressedPacketFields, config?: openpgp.Config) => Promise<void>;
}

/**
 * Wraps the literal data in a zlib Compressed Data packet, compressed by Node's zlib. Setting
 * `compressed` up front makes OpenPGP.js write it as is instead of compressing again.
 */
function zlibCompressed(message: openpgp.Message<WebStream>): openpgp.Message<WebStream> {
  const packet = new openpgp.CompressedDataPacket() as unknown as CompressedPacketFields;
  packet.algorithm = enums.compression.zlib;
  packet.packets = message.packets;
  const literal = message.packets.write() as unknown as WebStream;
  packet.compressed = throughNodeZlib(literal, createDeflate({ level: ZLIB_LEVEL, chunkSize: ZLIB_CHUNK }));
  const list = new openpgp.PacketList<openpgp.AnyPacket>();
  list.push(packet as unknown as openpgp.CompressedDataPacket);
  return Object.assign(new openpgp.Message<WebStream>(list), { fromStream: true });
}

/**
 * Makes OpenPGP.js inflate streamed zlib/zip packets with Node's zlib: the packet is handed to the
 * original method as "uncompressed" with already inflated data, so OpenPGP.js still applies
 * `maxDecompressedMessageSize` and parses the inner packets itself. Process-wide, idempotent, and only
 * for streamed input (buffered messages keep the stock path). Covered by the round-trip, interop
 * (gpg's zlib output) and decompression-bomb tests, which would catch a change of OpenPGP.js internals.
 */
function installStreamingInflate(): void {
  const proto = openpgp.CompressedDataPacket.prototype as unknown as CompressedPacketFields & { [PATCHED]?: true };
  if (proto[PATCHED]) return;
  const original = proto.decompress;
  if (typeof original !== 'function') throw new Error('OpenPGP.js internals changed: CompressedDataPacket.decompress is gone');
  proto.decompress = async function (this: CompressedPacketFields, config?: openpgp.Config) {
    const raw = this.algorithm === enums.compression.zip;
    if (!(this.compressed instanceof ReadableStream) || !(raw || this.algorithm === enums.compression.zlib)) {
      return original.call(this, config);
    }
    const algorithm = this.algorithm;
    const inflate = raw ? createInflateRaw({ chunkSize: ZLIB_CHUNK }) : createInflate({ chunkSize: ZLIB_CHUNK });
    this.compressed = throughNodeZlib(this.compressed as WebStream, inflate);
    this.algorithm = enums.compression.uncompressed;
    try {
      await original.call(this, config);
    } finally {
      this.algorithm = algorithm;
    }
  };
  proto[PATCHED] = true;
}
const PATCHED = Symbol.for('kms.openpgp.streamingInflate');
installStreamingInflate();

function throughNodeZlib(input: WebStream, transform: NodeJS.ReadWriteStream & Readable): ReadableStream<Uint8Array> {
  // Errors (a broken input, a bad zlib stream) reach whoever reads the returned stream.
  pipeline(new WebSource(input, asError, false), transform).catch(() => {});
  return new NodeSource(transform).open();
}

/** Streams we hand to OpenPGP.js already re-framed (the top level of a message). */
const reframed = new WeakSet<object>();

/**
 * Makes OpenPGP.js re-frame every other streamed packet list it parses: the packets inside encrypted
 * and compressed data, which our top-level `reframe` does not reach. OpenPGP.js's cost is per partial
 * chunk (1 MiB of 1-octet chunks inside the encrypted data took it 11 s), and it never settles on some
 * packets there (an encrypted-data packet: one changed octet makes one). Process-wide and idempotent,
 * like the inflate patch; covered by the hostile-input tests.
 */
function installInnerReframe(): void {
  const proto = openpgp.PacketList.prototype as unknown as { read: (bytes: unknown, ...rest: unknown[]) => Promise<void>; [PATCHED_READ]?: true };
  if (proto[PATCHED_READ]) return;
  const original = proto.read;
  if (typeof original !== 'function') throw new Error('OpenPGP.js internals changed: PacketList.read is gone');
  proto.read = function (this: unknown, bytes: unknown, ...rest: unknown[]) {
    const inner = bytes instanceof ReadableStream && !reframed.has(bytes);
    return original.call(this, inner ? rewriteWeb(bytes as WebStream, (chunks) => reframe(chunks, true)) : bytes, ...rest);
  };
  proto[PATCHED_READ] = true;
}
const PATCHED_READ = Symbol.for('kms.openpgp.innerReframe');
installInnerReframe();

/** `stream` through a byte-level rewrite, pull-based. A rewrite error cancels `stream` (releases its source). */
function rewriteWeb(stream: WebStream, rewrite: (chunks: AsyncIterable<Uint8Array>) => AsyncIterable<Uint8Array>): ReadableStream<Uint8Array> {
  const reader = stream.getReader();
  async function* chunks(): AsyncGenerator<Uint8Array> {
    for (let r = await reader.read(); !r.done; r = await reader.read()) yield typeof r.value === 'string' ? Buffer.from(r.value) : r.value;
  }
  const iterator = rewrite(chunks())[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>(
    {
      pull: async (controller) => {
        try {
          const next = await iterator.next();
          if (next.done) controller.close();
          else controller.enqueue(next.value);
        } catch (err) {
          reader.cancel(err).catch(() => {});
          throw err;
        }
      },
      cancel: (reason) => reader.cancel(reason),
    },
    { highWaterMark: 0 },
  );
}

// ---------------------------------------------------------------------------------------- decrypt

export interface OpenEncryptedOptions extends WatchOptions {
  /** Cap on the decompressed size of compressed messages (decompression bombs): past it, integrity_check_failed. */
  maxDecompressedBytes: number;
  /**
   * Decrypt and verify: the signatures inside are checked against `keys` once the last byte has been
   * read (`DecryptedStream.signature`); with `require`, a missing or bad one fails the stream before
   * its end (422 signature_required / signature_invalid), so no plaintext is published.
   */
  verify?: { keys: VerificationKey[]; require: boolean };
  // `signal` aborts reading: every call into OpenPGP.js and every read of its output races it, and the
  // input is destroyed. Jobs pass their watchdog's signal (deadline and no-progress limit). `idleMs`
  // (default 30 s): OpenPGP.js never settles on some hostile messages; 422 malformed_message after it.
}

interface DecryptedStream extends Readable {
  /** File name from the literal data packet ('' when none). */
  filename: string;
  /** With `verify`: the signatures' verdict, settled once the stream has ended. */
  signature?: Promise<SignatureCheck>;
}

export interface OpenedMessage {
  /** Lowercase hex key ids the message is encrypted to (pkesk.ts's WILDCARD_KEY_ID for a hidden recipient). */
  encryptionKeyIds: string[];
  /** Decrypts as a stream. Call once. Integrity failures arrive as an error at the end of the stream. */
  decrypt(privateKey: openpgp.PrivateKey): Promise<DecryptedStream>;
}

/**
 * Reads the head of an encrypted message (armored or binary, detected) up to its encrypted data packet,
 * so the caller can pick the key by recipient key id, then decrypts as a stream.
 *
 * Errors, AppError 422: before decryption, malformed_message (not an OpenPGP public-key encrypted
 * message, or broken packets) and no_matching_key (not encrypted to this key); once decryption has
 * begun, whatever fails (MDC or AEAD tag, inner packets, decompression and its size limit, truncation,
 * the idle timeout), integrity_check_failed with one message (integrity.ts), from `decrypt` or on the
 * output stream. An error of the input stream itself and the signal's reason are passed on unchanged.
 *
 * SEIPDv1 is decrypted with `allowUnauthenticatedStream` (otherwise OpenPGP.js buffers the whole file
 * until the MDC check), so unverified plaintext flows out before the check. The output holds back its
 * last chunk until the source has ended cleanly, so a failed check never yields the complete
 * plaintext; callers must still write to a temporary place and publish only after a clean end.
 */
export async function openEncrypted(input: Readable, opts: OpenEncryptedOptions): Promise<OpenedMessage> {
  if (!(opts.maxDecompressedBytes > 0)) throw new Error('openEncrypted: maxDecompressedBytes must be positive');
  const watch = new Watch(input, opts);
  watch.check();
  // The common case (SEIPDv1, AES, no compression; binary or armored) runs on Node's own crypto, which
  // also vets the packets inside; the rest goes to OpenPGP.js.
  let opened: OpenedMessage;
  try {
    opened = await openNative(await binaryPackets(input), (replayed, sessionKey) => openWithOpenPGPjs(replayed, opts, watch, sessionKey));
  } catch (err) {
    watch.close();
    throw watch.failure ?? err;
  }
  return {
    encryptionKeyIds: opened.encryptionKeyIds,
    async decrypt(privateKey) {
      try {
        const out: DecryptedStream = await opened.decrypt(privateKey);
        // A message the native path reads whole holds no signature (signed ones go to OpenPGP.js).
        if (opts.verify && !out.signature) {
          if (opts.verify.require) {
            out.destroy();
            throw invalid('signature_required', 'The message is not signed, and a signature is required.');
          }
          out.signature = Promise.resolve({ valid: false, signer_fingerprint: null, signed_at: null, reason: 'unsigned' });
        }
        // The native output would otherwise fail with the destroyed input's "premature close". Decryption
        // has begun: an idle timeout answers like any other failure from here on (integrity.ts).
        watch.onFail((err) => out.destroy(afterDecryption(err, { signal: opts.signal })));
        out.once('close', () => watch.close());
        return out;
      } catch (err) {
        watch.close();
        // The caller's stop is its own answer; any other failure is already classified by the path.
        throw opts.signal?.aborted && watch.failure === opts.signal.reason ? watch.failure : err;
      }
    },
  };
}

/**
 * Armored input is de-armored here, so that both paths read binary packets. Destroying the result
 * destroys `input`; an error of `input` comes out unchanged (a storage error is not a bad message).
 */
async function binaryPackets(input: Readable): Promise<Readable> {
  const it = input[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  const head: Buffer[] = [];
  let seen = 0;
  let first: number | undefined;
  while (first === undefined && seen < 64 * 1024) {
    const next = await it.next();
    if (next.done) break;
    head.push(next.value);
    seen += next.value.length;
    first = next.value.find((b) => b !== 0x20 && b !== 0x09 && b !== 0x0a && b !== 0x0d);
  }
  async function* all(): AsyncGenerator<Uint8Array> {
    yield* head;
    for (let next = await it.next(); !next.done; next = await it.next()) yield next.value;
  }
  const out = Readable.from(first === 0x2d ? dearmor(all()) : all(), ONE_PIECE);
  out.once('close', () => input.destroy());
  return out;
}

/**
 * `sessionKey`: when the native path already decrypted it (then OpenPGP.js does not decrypt it again).
 * Every call and output read races `watch` (signal, idle timeout): OpenPGP.js may never settle.
 */
async function openWithOpenPGPjs(input: Readable, opts: OpenEncryptedOptions, watch: Watch, sessionKey?: openpgp.SessionKey): Promise<OpenedMessage> {
  const source = new NodeSource(input, watch);
  const fail = (err: AppError) => {
    input.destroy();
    return err;
  };
  const kind = await source.sniff();
  if (kind === 'empty') throw fail(invalid('malformed_message', 'The message is empty.'));
  if (kind === 'unknown') throw fail(invalid('malformed_message', 'Not an OpenPGP message (neither armored nor binary packets).'));

  const config: openpgp.PartialConfig = {
    ...SESSION_KEY_CONFIG,
    allowUnauthenticatedStream: true,
    allowUnauthenticatedMessages: false,
    maxDecompressedMessageSize: opts.maxDecompressedBytes,
  };
  const message = await readMessageFrom(source, kind, input, watch, config);
  const chunkSizeByte = aeadChunkSizeByte(message);
  if (chunkSizeByte > MAX_AEAD_CHUNK_SIZE_BYTE) {
    throw fail(invalid('malformed_message', `The message is malformed: AEAD chunks of 2^${chunkSizeByte + 6} octets (at most 2^22).`));
  }
  const encryptionKeyIds = [...new Set(message.getEncryptionKeyIDs().map((id) => id.toHex()))];
  if (encryptionKeyIds.length === 0) throw fail(invalid('malformed_message', 'The message is not encrypted to a public key.'));

  let used = false;
  return {
    encryptionKeyIds,
    async decrypt(privateKey) {
      if (used) throw new Error('openEncrypted: decrypt() can be called once');
      if (!privateKey.isDecrypted()) throw new Error('openEncrypted: the private key must be unlocked first');
      used = true;
      if (!sessionKeyPacketsFor(message, privateKey).length) {
        throw fail(invalid('no_matching_key', 'The message is not encrypted to this key.'));
      }
      let sessionKeys: openpgp.SessionKey | undefined;
      try {
        // SEIPDv1: one session key, chosen by us (see sessionKeyV1); OpenPGP.js would try several at once.
        const v1 = (message.packets.findPacket(enums.packet.symEncryptedIntegrityProtectedData) as { version?: number } | undefined)?.version === 1;
        if (!sessionKey && !v1) checkSessionKeyPackets(message, privateKey); // sessionKeyV1 checks its own
        sessionKeys = sessionKey ?? (v1 ? await watch.call(sessionKeyV1(message, privateKey)) : undefined);
      } catch (err) {
        input.destroy();
        throw watch.failure ?? source.failure ?? mapDecryptError(err);
      }
      // Decryption begins (with a session key of ours, or with the session key packet's opening for other
      // formats): from then on a failure answers integrity.ts's one error, whatever failed.
      const failed = (err: unknown, opening = !sessionKeys) => {
        const cause = watch.failure ?? source.failure ?? err;
        const mapped = opening ? mapDecryptError(cause) : undefined;
        if (mapped instanceof AppError && mapped.code === 'no_matching_key') return mapped;
        return afterDecryption(cause, { signal: opts.signal, inputError: source.failure });
      };
      let result: { data: unknown; filename: string; signatures: VerificationResult[] };
      const verificationKeys = opts.verify ? { verificationKeys: opts.verify.keys.map((k) => k.key) } : {};
      try {
        result = await watch.call(
          sessionKeys
            ? openpgp.decrypt({ message, sessionKeys, format: 'binary', config, ...verificationKeys })
            : openpgp.decrypt({ message, decryptionKeys: privateKey, format: 'binary', config, ...verificationKeys }),
        );
      } catch (err) {
        input.destroy();
        throw failed(err);
      }
      const verify = opts.verify;
      if (!verify) return Object.assign(new WebSource(result.data as WebStream, (err) => failed(err, false), true, watch), { filename: result.filename ?? '' });
      // The signatures verify once every byte has been hashed: judged at the end, before the held last chunk goes out.
      let verdict!: (check: SignatureCheck) => void;
      const signature = new Promise<SignatureCheck>((resolve) => (verdict = resolve));
      const { judge } = await import('./signatures');
      const out = new WebSource(
        result.data as WebStream,
        (err) => failed(err, false),
        true,
        watch,
        async () => {
          const check = await judge(result.signatures, verify.keys);
          verdict(check);
          if (verify.require && !check.valid) {
            throw check.reason === 'unsigned'
              ? invalid('signature_required', 'The message is not signed, and a signature is required.')
              : invalid('signature_invalid', `The message's signature is not valid (${check.reason}).`);
          }
        },
      );
      return Object.assign(out, { filename: result.filename ?? '', signature });
    },
  };
}

/**
 * The message of a sniffed source, through our own de-armoring and re-framing (see `dearmor` and
 * `reframe` for why), parsed by OpenPGP.js under `watch`: 422 malformed_message when it cannot be read.
 */
export async function readMessageFrom(
  source: NodeSource,
  kind: 'armored' | 'binary',
  input: Readable,
  watch: Watch,
  config: openpgp.PartialConfig,
): Promise<openpgp.Message<WebStream>> {
  try {
    const bytes = source.open((chunks) => reframe(kind === 'armored' ? dearmor(chunks) : chunks));
    reframed.add(bytes);
    return await watch.call(openpgp.readMessage({ binaryMessage: bytes, config }));
  } catch (err) {
    input.destroy();
    throw watch.failure ?? source.failure ?? invalid('malformed_message', `Not a readable OpenPGP message: ${errMessage(err)}`);
  }
}

/** RFC 9580 §5.13.2: 2^22-octet chunks at most. OpenPGP.js reads a whole chunk before it decrypts it, whatever its size. */
const MAX_AEAD_CHUNK_SIZE_BYTE = 16;

/** The chunk size octet of the message's AEAD packet (SEIPDv2 or the draft's AEAD packet); -1 when none. */
function aeadChunkSizeByte(message: openpgp.Message<openpgp.MaybeStream<Uint8Array | string>>): number {
  const packet = message.packets.findPacket(enums.packet.symEncryptedIntegrityProtectedData) ?? message.packets.findPacket(enums.packet.aeadEncryptedData);
  return (packet as { chunkSizeByte?: number | null } | undefined)?.chunkSizeByte ?? -1;
}

function mapDecryptError(err: unknown): Error {
  const ours = appErrorIn(err);
  if (ours) return ours;
  const msg = errMessage(err);
  if (/session key decryption failed|no decryption key packets/i.test(msg)) {
    return invalid('no_matching_key', 'The message cannot be decrypted with this key.');
  }
  // "Key Data Integrity failed" (ECDH key unwrap of a modified session key packet), unauthenticated
  // (SED) data; failures once decrypting are classified by `afterDecryption` instead.
  if (/modification detected|authentication tag mismatch|unable to authenticate|integrity|not authenticated/i.test(msg)) return integrityFailure();
  return invalid('malformed_message', `The message is malformed: ${msg}`);
}

/** Our own error (the inner re-framing's), also where OpenPGP.js has wrapped it (as the `cause`). */
function appErrorIn(err: unknown): AppError | undefined {
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) if (e instanceof AppError) return e;
  return undefined;
}

// ---------------------------------------------------------------------------------------- framing

const malformed = (why: string) => invalid('malformed_message', `The message is malformed: ${why}`);

/**
 * Decodes ASCII armor with Node's base64 (OpenPGP.js decodes in JS, ~3× slower). Header lines are
 * skipped and the CRC24 line is ignored, as RFC 9580 §6.1 requires of receivers (the MDC or AEAD tag
 * protects the data). Stops at the END line: anything after the first message is not read.
 */
/** Longer than any read plus what is carried over, so only a line that never ends can reach it. */
const MAX_ARMOR_LINE = 4 << 20;

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

/**
 * Rewrites the framing of a packet list, not the packets' contents: a body sent in partial-length
 * chunks (gpg 2.2 uses 8 KiB ones) is re-chunked into CHUNK_BYTES pieces. OpenPGP.js's cost is per
 * chunk, so gpg's messages decrypt ~5× faster this way (41 → ~200 MiB/s measured). Integrity is
 * unaffected: the MDC and AEAD tags cover the decrypted contents, not the outer length headers.
 * `inner`: the list inside encrypted or compressed data, where session keys and encrypted data have
 * no place (OpenPGP.js refuses them too, when it does not hang on them).
 */
async function* reframe(chunks: AsyncIterable<Uint8Array>, inner = false): AsyncGenerator<Uint8Array> {
  const r = new ByteReader(chunks[Symbol.asyncIterator]());
  let small = 0;
  for (;;) {
    const tag = await r.byte();
    if (tag === null) return;
    if (!(tag & 0x80)) throw malformed('invalid packet header');
    const packetTag = tag & 0x40 ? tag & 0x3f : (tag >> 2) & 0x0f;
    if (inner && OUTER_TAGS.has(packetTag)) throw malformed(`a packet of type ${packetTag} inside encrypted or compressed data`);
    // OpenPGP.js buffers all but data packets whole: cap their size and number (session keys, signatures
    // and padding are far smaller and fewer), and a marker is "PGP" (RFC 9580 §5.8).
    const isData = DATA_TAGS.has(packetTag);
    if (!isData && ++small > MAX_SMALL_PACKETS) throw malformed(`more than ${MAX_SMALL_PACKETS} packets besides the data`);
    const checkLength = (n: number) => {
      if (packetTag === 10 && n !== 3) throw malformed('a marker packet that is not "PGP"');
      if (!isData && n > MAX_SMALL_PACKET) throw malformed(`a packet of type ${packetTag} longer than ${MAX_SMALL_PACKET} octets`);
    };
    if (!(tag & 0x40)) {
      // Legacy format: lengths of 1, 2 or 4 octets, or "until the end" (type 3).
      const type = tag & 3;
      if (type === 3) {
        if (!isData) throw malformed(`a packet of type ${packetTag} of indeterminate length`);
        yield Uint8Array.of(tag);
        yield* r.rest();
        return;
      }
      const length = await r.exact(1 << type);
      const n = length.reduce((n, b) => n * 256 + b, 0);
      checkLength(n);
      yield concatBytes([Uint8Array.of(tag), length]);
      yield* r.body(n);
      continue;
    }
    const first = await r.need();
    if (first < 224 || first === 255) {
      const rest = await r.exact(first < 192 ? 0 : first < 224 ? 1 : 4);
      const n = definiteLength(first, rest);
      checkLength(n);
      yield concatBytes([Uint8Array.of(tag, first), rest]);
      yield* r.body(n);
      continue;
    }
    if (!isData) throw malformed(`partial body lengths in a packet of type ${packetTag}`); // RFC 9580 §4.2.1.4
    // Partial body lengths: collect and re-emit as CHUNK_BYTES partial chunks plus a definite last one.
    yield Uint8Array.of(tag);
    let pending: Uint8Array[] = [];
    let pendingBytes = 0;
    for (let lengthOctet = first; ; lengthOctet = await r.need()) {
      const isPartial = lengthOctet >= 224 && lengthOctet < 255;
      if (isPartial && 2 ** (lengthOctet & 0x1f) < MIN_PARTIAL) throw malformed(`a partial body length below ${MIN_PARTIAL} octets`);
      const size = isPartial ? 2 ** (lengthOctet & 0x1f) : definiteLength(lengthOctet, await r.exact(lengthOctet < 192 ? 0 : lengthOctet < 224 ? 1 : 4));
      for await (const piece of r.body(size)) {
        pending.push(piece);
        pendingBytes += piece.length;
        // Full chunks; and whatever is here before waiting for input, so nothing stalls on a slow source.
        const waiting = r.buffered() === 0 && pendingBytes >= 512;
        while (pendingBytes >= CHUNK_BYTES || (waiting && pendingBytes >= 512)) {
          const n = Math.min(CHUNK_BYTES, 2 ** Math.floor(Math.log2(pendingBytes)));
          const all = concatBytes(pending);
          yield Uint8Array.of(224 + Math.log2(n));
          yield all.subarray(0, n);
          pending = [all.subarray(n)];
          pendingBytes -= n;
        }
      }
      if (!isPartial) break;
    }
    const header = new Uint8Array(5);
    header[0] = 255;
    new DataView(header.buffer).setUint32(1, pendingBytes);
    yield header;
    if (pendingBytes) yield concatBytes(pending);
  }
}

/** Packets that may be streamed (partial lengths; RFC 9580 §4.2.1.4): compressed, SED, literal, SEIPD, AEAD. */
const DATA_TAGS = new Set([8, 9, 11, 18, 20]);
/** Session key and encrypted-data packets: not inside encrypted or compressed data. */
const OUTER_TAGS = new Set([1, 3, 9, 18, 20]);
/** Largest other packet we pass on: RSA-16384 session keys and signatures are a few KiB. */
const MAX_SMALL_PACKET = 64 * 1024;

function countNewlines(text: string): number {
  let n = 0;
  for (let i = text.indexOf('\n'); i >= 0; i = text.indexOf('\n', i + 1)) n++;
  return n;
}

function definiteLength(first: number, rest: Uint8Array): number {
  if (first < 192) return first;
  if (first < 224) return ((first - 192) << 8) + rest[0] + 192;
  return new DataView(rest.buffer, rest.byteOffset, 4).getUint32(0);
}

function concatBytes(parts: Uint8Array[]): Uint8Array {
  if (parts.length === 1) return parts[0];
  const all = Buffer.concat(parts);
  return new Uint8Array(all.buffer, all.byteOffset, all.byteLength);
}

/** Reads bytes from chunks without copying more than it must; never holds more than one chunk. */
class ByteReader {
  private chunk: Uint8Array = new Uint8Array(0);
  private at = 0;

  constructor(private readonly source: AsyncIterator<Uint8Array>) {}

  private async fill(): Promise<boolean> {
    while (this.at >= this.chunk.length) {
      const next = await this.source.next();
      if (next.done) return false;
      this.chunk = next.value;
      this.at = 0;
    }
    return true;
  }

  /** Bytes available without waiting for the source. */
  buffered(): number {
    return this.chunk.length - this.at;
  }

  async byte(): Promise<number | null> {
    return (await this.fill()) ? this.chunk[this.at++] : null;
  }

  async need(): Promise<number> {
    const b = await this.byte();
    if (b === null) throw malformed('unexpected end of a packet header');
    return b;
  }

  async exact(n: number): Promise<Uint8Array> {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = await this.need();
    return out;
  }

  /** Streams the next `n` bytes in pieces as they arrive. */
  async *body(n: number): AsyncGenerator<Uint8Array> {
    while (n > 0) {
      if (!(await this.fill())) throw malformed('unexpected end of a packet');
      const piece = this.chunk.subarray(this.at, this.at + Math.min(n, this.chunk.length - this.at));
      this.at += piece.length;
      n -= piece.length;
      yield piece;
    }
  }

  async *rest(): AsyncGenerator<Uint8Array> {
    while (await this.fill()) {
      const piece = this.chunk.subarray(this.at);
      this.at = this.chunk.length;
      yield piece;
    }
  }
}

// ---------------------------------------------------------------------------------------- adapters

/** OpenPGP.js declares its stream type through a package it does not install: name ours. */
export type WebStream = ReadableStream<Uint8Array | string>;

/**
 * A Node Readable as a pull-based web stream of Uint8Array, optionally through a byte-level rewrite.
 * `failure` keeps the first error raised on our side of OpenPGP.js (the input's own error, or a
 * malformed_message from the rewrite), because OpenPGP.js rewraps errors that pass through it.
 */
export class NodeSource {
  failure: Error | undefined;
  private readonly iterator: AsyncIterator<unknown>;
  private readonly head: Uint8Array[] = [];

  constructor(
    private readonly input: Readable,
    private readonly watch?: Watch,
  ) {
    this.iterator = input[Symbol.asyncIterator]();
  }

  private async next(): Promise<Uint8Array | null> {
    const next = await (this.watch ? this.watch.pulling(this.iterator.next()) : this.iterator.next());
    if (next.done) return null;
    if (typeof next.value === 'string') return Buffer.from(next.value);
    const bytes = next.value as Uint8Array;
    // A plain Uint8Array view (no copy): OpenPGP.js expects Uint8Array, not Buffer's subclass.
    return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  private async *chunks(): AsyncGenerator<Uint8Array> {
    for (let c = this.head.shift(); c; c = this.head.shift()) yield c;
    for (let c = await this.next(); c; c = await this.next()) yield c;
  }

  /** Reads (and keeps) the first bytes to tell an armored message from binary packets. */
  async sniff(): Promise<'armored' | 'binary' | 'empty' | 'unknown'> {
    for (let seen = 0; seen < 64 * 1024;) {
      let chunk: Uint8Array | null;
      try {
        chunk = await this.next();
      } catch (err) {
        throw (this.failure = asError(err));
      }
      if (!chunk) return seen ? 'unknown' : 'empty';
      this.head.push(chunk);
      seen += chunk.length;
      const first = chunk.find((b) => b !== 0x20 && b !== 0x09 && b !== 0x0a && b !== 0x0d);
      if (first === undefined) continue;
      if (first & 0x80) return 'binary'; // packet header: bit 7 always set
      return first === 0x2d /* '-' of -----BEGIN PGP MESSAGE----- */ ? 'armored' : 'unknown';
    }
    return 'unknown';
  }

  open(rewrite: (chunks: AsyncIterable<Uint8Array>) => AsyncIterable<Uint8Array> = (c) => c): ReadableStream<Uint8Array> {
    const iterator = rewrite(this.chunks())[Symbol.asyncIterator]();
    let cancelled = false;
    return new ReadableStream<Uint8Array>(
      {
        pull: async (controller) => {
          try {
            const next = await iterator.next();
            if (next.done) controller.close();
            else controller.enqueue(next.value);
          } catch (err) {
            // After a cancel, the input's "premature close" is our doing, not the cause of anything.
            if (!cancelled) this.failure ??= asError(err);
            throw err;
          }
        },
        cancel: () => {
          cancelled = true;
          this.input.destroy();
        },
      },
      { highWaterMark: 0 },
    );
  }
}

/**
 * A web stream as a Node Readable, errors mapped. With `holdBack`, the last chunk is released only once
 * the source has ended without error, so an integrity failure at the end never lets all of it through.
 */
export class WebSource extends Readable {
  private readonly reader: ReadableStreamDefaultReader<Uint8Array | string>;
  private pumping = false;
  private held: Buffer | null = null;

  constructor(
    stream: WebStream,
    private readonly mapError: (err: unknown) => Error,
    private readonly holdBack: boolean,
    private readonly watch?: Watch,
    /** Runs once the source has ended, before the end (and a held chunk) goes out; its error ends the stream as is. */
    private readonly beforeEnd?: () => Promise<void>,
  ) {
    super({ highWaterMark: CHUNK_BYTES });
    this.reader = stream.getReader();
    if (watch) {
      watch.onFail((err) => this.destroy(this.mapError(err)));
      this.once('close', () => watch.close());
    }
  }

  override _read(): void {
    if (this.pumping) return;
    this.pumping = true;
    void this.pump();
  }

  private async pump(): Promise<void> {
    try {
      for (;;) {
        const idle = this.watch?.busy();
        const { done, value } = await this.reader.read().finally(idle);
        if (this.destroyed) return;
        this.watch?.moved();
        if (done) {
          if (this.beforeEnd) {
            try {
              await this.beforeEnd();
            } catch (err) {
              this.held = null;
              if (!this.destroyed) this.destroy(asError(err));
              return;
            }
          }
          if (this.held) this.push(this.held);
          this.held = null;
          this.push(null);
          return;
        }
        const chunk = typeof value === 'string' ? Buffer.from(value) : Buffer.from(value.buffer, value.byteOffset, value.byteLength);
        if (chunk.length === 0) continue;
        let toPush: Buffer | null = chunk;
        if (this.holdBack) [toPush, this.held] = [this.held, chunk];
        if (toPush && !this.push(toPush)) {
          this.pumping = false;
          return;
        }
      }
    } catch (err) {
      this.held = null;
      if (!this.destroyed) this.destroy(this.mapError(err));
    }
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    this.held = null;
    this.reader.cancel(err ?? undefined).catch(() => {});
    callback(err);
  }
}
