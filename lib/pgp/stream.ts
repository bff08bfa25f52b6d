import { Readable } from 'node:stream';
import * as openpgp from 'openpgp';
import { invalid } from '../errors';
import { ONE_PIECE, pullStream } from '../streams';
import { dearmor, sniffArmor } from './armor';
import { type Decrypted, encryptNative, encryptPqc, nativeEncryptable, openNative, recipientPreferences } from './native';
import { CHUNK_BYTES } from './packets';
import { isPqcKey, isPqcPrivateKey, type StoredPrivateKey, type StoredPublicKey } from './keys';
import { asError, errMessage } from './thrown';
import { UNSIGNED, judge, type SignatureCheck, type VerificationKey } from './verification';
import { Watch, type WatchOptions } from './watch';

/**
 * Streaming OpenPGP encryption and decryption with flat memory, whatever the file size.
 *
 * Decryption runs on Node's crypto (native.ts) and reads the content itself (content.ts); OpenPGP.js
 * opens the session keys pkesk.ts does not, and verifies signatures. Encryption runs on Node's crypto too
 * (to v4 and v6 keys), but for signing, which OpenPGP.js does, fed through pull-based adapters: Node streams at the edges,
 * web streams inside (OpenPGP.js rejects Node streams).
 */

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
  signingKey?: StoredPrivateKey;
}

/**
 * Encrypts `input` to `recipient`. For v4 keys without the SEIPDv2 feature flag (ours, gpg's, sq's)
 * the output is SEIPDv1 (MDC) with AES-256, which gpg 2.2 and sq read; for v6 keys and keys that list
 * SEIPDv2, SEIPDv2 with AES-256 in OCB or GCM (native.ts `messageFormat`). Errors on the returned stream:
 * the input's own error unchanged, anything else as it comes. An unusable key is 422 `no_encryption_key`.
 * `signal` aborts (its reason; the input is destroyed); `idleMs` (default 30 s) bounds how long
 * OpenPGP.js may move no bytes while we wait on it (422 `malformed_message`).
 */
export async function encryptStream(input: Readable, recipient: StoredPublicKey, opts: EncryptStreamOptions): Promise<Readable> {
  const watch = new Watch(input, opts);
  watch.check();
  if (opts.signingKey && isPqcPrivateKey(opts.signingKey)) {
    watch.close();
    throw invalid('signed_message_unsupported', 'A post-quantum key makes detached signatures only: encrypt without signing, and sign the file detached.');
  }
  const pqc = isPqcKey(recipient);
  const compress = (opts.compress ?? false) && (await acceptsZlib(recipient));
  if (pqc || (!opts.signingKey && nativeEncryptable(recipient))) {
    // Node's crypto cannot stall; only the signal applies.
    const out = await watch.call(pqc ? encryptPqc(input, recipient, { ...opts, compress }) : encryptNative(input, recipient, { ...opts, compress }));
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
  const message = await openpgp.createMessage({ binary: source.open(), filename, format: 'binary', date: opts.date });
  const config: openpgp.PartialConfig = {
    aeadProtect: false,
    preferredSymmetricAlgorithm: enums.symmetric.aes256,
    // Only used if a recipient key advertises SEIPDv2: GCM (~165 MiB/s), not OCB (~2 MiB/s), if it allows.
    preferredAEADAlgorithm: enums.aead.gcm,
    // zlib at its default level (gpg's too), through the platform's CompressionStream.
    preferredCompressionAlgorithm: compress ? enums.compression.zlib : enums.compression.uncompressed,
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
  return new WebSource(out, (err) => watch.failure ?? source.failure ?? asError(err), watch);
}

/** Recipients that do not list zlib get uncompressed data (only "uncompressed" is a MUST in RFC 9580). */
async function acceptsZlib(recipient: StoredPublicKey): Promise<boolean> {
  if (isPqcKey(recipient)) return recipient.preferences.compression.includes(enums.compression.zlib);
  return (await recipientPreferences(recipient))?.preferredCompressionAlgorithms?.includes(enums.compression.zlib) ?? false;
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
  // `signal` aborts reading (the input is destroyed). Jobs pass their watchdog's signal (deadline and
  // no-progress limit). `idleMs` (default 30 s): how long OpenPGP.js, verifying signatures, may move no
  // bytes (422 malformed_message before decryption, integrity_check_failed after).
}

interface DecryptedStream extends Readable {
  /** File name from the literal data packet ('' when none). */
  filename: string;
  /** With `verify`: the signatures' verdict, settled once the stream has ended. */
  signature?: Promise<SignatureCheck>;
}

export interface OpenedMessage {
  /** Whether the message was ASCII-armored. */
  armored: boolean;
  /** Lowercase hex key ids the message is encrypted to (pkesk.ts's WILDCARD_KEY_ID for a hidden recipient). */
  encryptionKeyIds: string[];
  /** Decrypts as a stream. Call once. Integrity failures arrive as an error at the end of the stream. */
  decrypt(privateKey: StoredPrivateKey): Promise<DecryptedStream>;
}

/**
 * Reads the head of an encrypted message (armored or binary, detected) up to its encrypted data packet,
 * so the caller can pick the key by recipient key id, then decrypts as a stream.
 *
 * Errors, AppError 422: before decryption, malformed_message (not an OpenPGP public-key encrypted
 * message, or broken packets), unsupported_message (a format native.ts does not decrypt) and
 * no_matching_key (not encrypted to this key); once decryption has begun, whatever fails (MDC or AEAD
 * tag, inner packets, decompression and its size limit, truncation, the idle timeout),
 * integrity_check_failed with one message (integrity.ts), on the output stream. An error of the input
 * stream itself and the signal's reason are passed on unchanged.
 *
 * Plaintext flows out before the integrity check at the end (SEIPDv1's MDC; SEIPDv2's final tag). The
 * output holds back its last chunk until the message has ended cleanly (and, with `verify`, its
 * signatures have been judged), so a failed check never yields the complete plaintext; callers must
 * still write to a temporary place and publish only after a clean end.
 */
export async function openEncrypted(input: Readable, opts: OpenEncryptedOptions): Promise<OpenedMessage> {
  if (!(opts.maxDecompressedBytes > 0)) throw new Error('openEncrypted: maxDecompressedBytes must be positive');
  const watch = new Watch(input, opts);
  watch.check();
  const contentOptions = { maxDecompressedBytes: opts.maxDecompressedBytes, verify: opts.verify?.keys, watch, signal: opts.signal };
  let opened: Awaited<ReturnType<typeof openNative>>;
  let armored: boolean;
  try {
    const binary = await binaryPackets(input);
    armored = binary.armored;
    opened = await openNative(binary.packets, contentOptions);
  } catch (err) {
    watch.close();
    throw watch.failure ?? err;
  }
  return {
    armored,
    encryptionKeyIds: opened.encryptionKeyIds,
    async decrypt(privateKey) {
      let content: Decrypted;
      try {
        content = await opened.decrypt(privateKey);
      } catch (err) {
        watch.close();
        // The caller's stop is its own answer; any other failure is already classified.
        throw opts.signal?.aborted && watch.failure === opts.signal.reason ? watch.failure : err;
      }
      const out = decryptedStream(content, opts.verify);
      watch.onFail((err) => out.destroy(content.failed(err)));
      out.once('close', () => watch.close());
      return out;
    },
  };
}

/**
 * The plaintext as a Node stream, its last chunk held back until the content has ended cleanly and,
 * with `verify`, the signatures have been judged (and, with `require`, found valid).
 */
function decryptedStream(content: Decrypted, verify: OpenEncryptedOptions['verify']): DecryptedStream {
  let verdict!: (check: SignatureCheck) => void;
  const signature = verify ? new Promise<SignatureCheck>((resolve) => (verdict = resolve)) : undefined;
  async function* held(): AsyncGenerator<Buffer> {
    let last: Buffer | undefined;
    try {
      for await (const c of content.data) {
        if (last) yield last;
        last = c;
      }
    } catch (err) {
      throw content.failed(err);
    }
    if (verify) {
      const check = content.signatures ? await judge(content.signatures, verify.keys) : UNSIGNED;
      verdict(check);
      if (verify.require && !check.valid) {
        throw check.reason === 'unsigned'
          ? invalid('signature_required', 'The message is not signed, and a signature is required.')
          : invalid('signature_invalid', `The message's signature is not valid (${check.reason}).`);
      }
    }
    if (last) yield last;
  }
  return Object.assign(Readable.from(held(), ONE_PIECE), { filename: content.filename, signature });
}

/**
 * A message's binary packets, de-armored here when armored (armor.ts), and whether it was. Destroying them
 * destroys `input`; an error of `input` comes out unchanged (a storage error is not a bad message).
 */
export async function binaryPackets(input: Readable): Promise<{ armored: boolean; packets: Readable }> {
  const { armored, chunks } = await sniffArmor(input);
  const packets = Readable.from(armored ? dearmor(chunks) : chunks, ONE_PIECE);
  packets.once('close', () => input.destroy());
  return { armored, packets };
}

// ---------------------------------------------------------------------------------------- adapters

/** OpenPGP.js declares its stream type through a package it does not install: name ours. */
export type WebStream = ReadableStream<Uint8Array | string>;

/**
 * A Node Readable as a pull-based web stream of Uint8Array. `failure` keeps the input's own error,
 * because OpenPGP.js rewraps errors that pass through it. Its reads are waits on our input (watch.ts).
 */
export class NodeSource {
  failure: Error | undefined;
  private cancelled = false;

  constructor(
    private readonly input: Readable,
    private readonly watch?: Watch,
  ) {}

  private async *chunks(): AsyncGenerator<Uint8Array> {
    const iterator = this.input[Symbol.asyncIterator]() as AsyncIterator<Uint8Array | string>;
    for (;;) {
      let next: IteratorResult<Uint8Array | string>;
      try {
        next = await (this.watch ? this.watch.pulling(iterator.next()) : iterator.next());
      } catch (err) {
        // After a cancel, the input's "premature close" is our doing, not the cause of anything.
        if (!this.cancelled) this.failure ??= asError(err);
        throw err;
      }
      if (next.done) return;
      const v = next.value;
      // A plain Uint8Array view (no copy): OpenPGP.js expects Uint8Array, not Buffer's subclass.
      yield typeof v === 'string' ? Buffer.from(v) : new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
    }
  }

  open(): ReadableStream<Uint8Array> {
    return pullStream(this.chunks(), () => {
      this.cancelled = true;
      this.input.destroy();
    });
  }
}

/** A web stream as a Node Readable, errors mapped; every read is a wait on OpenPGP.js (watch.ts). */
export class WebSource extends Readable {
  private readonly reader: ReadableStreamDefaultReader<Uint8Array | string>;
  private pumping = false;

  constructor(
    stream: WebStream,
    private readonly mapError: (err: unknown) => Error,
    private readonly watch?: Watch,
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
          this.push(null);
          return;
        }
        const chunk = typeof value === 'string' ? Buffer.from(value) : Buffer.from(value.buffer, value.byteOffset, value.byteLength);
        if (chunk.length && !this.push(chunk)) {
          this.pumping = false;
          return;
        }
      }
    } catch (err) {
      if (!this.destroyed) this.destroy(this.mapError(err));
    }
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    this.reader.cancel(err ?? undefined).catch(() => {});
    callback(err);
  }
}
