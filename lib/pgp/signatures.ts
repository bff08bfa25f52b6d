import type { Readable } from 'node:stream';
import * as openpgp from 'openpgp';
import { AppError, invalid, tooLarge } from '../errors';
import { MAX_SIGNATURE_PACKET_BYTES, readSuppliedPublicKey } from './import';
import { isPqcPrivateKey, scanPackets, type StoredPrivateKey } from './keys';
import { readContent } from './content';
import { Pull, tagOf } from './packets';
import { NodeSource, WebSource, binaryPackets, type WebStream } from './stream';
import { asError, errMessage } from './thrown';
import { Watch, type WatchOptions } from './watch';
import { UNSIGNED, judge, type SignatureCheck, type VerificationKey, type VerificationResult } from './verification';

/**
 * OpenPGP signatures, streamed: one pass over the data, hashed as bytes flow, memory flat whatever the
 * size. Signing makes v4 signatures with SHA-256 or stronger (OpenPGP.js never picks less than its
 * MUST-implement SHA-256) and the signing time; verifying reports its result only after the last byte.
 * Every call into OpenPGP.js races the caller's signal and the idle limit (watch.ts).
 */

/** A detached signature file: a few signatures of a few hundred octets each. */
export const MAX_SIGNATURE_BYTES = 64 * 1024;
/** Signatures in one detached signature file. */
const MAX_SIGNATURES = 16;

export interface SignOptions extends WatchOptions {
  /** Detached signature (`.sig`/`.asc`) rather than a signed message holding the data. */
  detached: boolean;
  armor: boolean;
  /** Kept in a signed message's literal packet (max 255 UTF-8 bytes). */
  filename?: string;
}

export async function signStream(input: Readable, signingKey: StoredPrivateKey, opts: SignOptions): Promise<Readable> {
  const watch = new Watch(input, opts);
  watch.check();
  if (isPqcPrivateKey(signingKey)) {
    watch.close();
    throw invalid('no_signing_key', 'This key cannot sign: post-quantum signing is not available yet.');
  }
  const filename = opts.filename ?? '';
  if (Buffer.byteLength(filename) > 255) {
    watch.close();
    throw invalid('invalid_filename', 'The file name must be at most 255 bytes of UTF-8.');
  }
  const source = new NodeSource(input, watch);
  let out: WebStream;
  try {
    const message = await openpgp.createMessage({ binary: source.open(), filename, format: 'binary' });
    const base = { message, signingKeys: signingKey, detached: opts.detached };
    out = opts.armor ? await watch.call(openpgp.sign({ ...base, format: 'armored' })) : await watch.call(openpgp.sign({ ...base, format: 'binary' }));
  } catch (err) {
    input.destroy();
    watch.close();
    if (watch.failure) throw watch.failure;
    if (/signing key|expired|revoked/i.test(errMessage(err))) throw invalid('no_signing_key', `This key cannot sign: ${errMessage(err)}`);
    throw err;
  }
  return new WebSource(out, (err) => watch.failure ?? source.failure ?? asError(err), watch);
}

/**
 * Reads a detached signature file (armored or binary) sent with a request: only signature packets,
 * each at most MAX_SIGNATURE_PACKET_BYTES (huge subpacket areas are refused unread). 413 signature_too_large; 422 malformed_signature.
 */
export async function readDetachedSignature(bytes: Uint8Array): Promise<openpgp.Signature> {
  if (bytes.length > MAX_SIGNATURE_BYTES) throw tooLarge('signature_too_large', `A signature is larger than ${MAX_SIGNATURE_BYTES} bytes.`);
  const malformed = (why: string) => invalid('malformed_signature', `A signature cannot be read: ${why}`);
  const armored = Buffer.from(bytes.subarray(0, 64)).toString('latin1').trimStart().startsWith('-----BEGIN PGP SIGNATURE-----');
  try {
    const binary = armored ? new Uint8Array(await new Response((await openpgp.unarmor(Buffer.from(bytes).toString('utf8'))).data).arrayBuffer()) : bytes;
    const packets = scanPackets(binary);
    if (packets.length === 0 || packets.length > MAX_SIGNATURES || packets.some((p) => p.tag !== 2))
      throw malformed(`expected 1 to ${MAX_SIGNATURES} signature packets.`);
    if (packets.some((p) => p.length > MAX_SIGNATURE_PACKET_BYTES)) throw malformed(`a signature packet is longer than ${MAX_SIGNATURE_PACKET_BYTES} octets.`);
    return await openpgp.readSignature({ binarySignature: binary });
  } catch (err) {
    if (err instanceof AppError) throw err;
    throw malformed(`${errMessage(err)}.`);
  }
}

/**
 * Reads a public key a caller supplies to verify with (untrusted): one key, no secret material, within
 * the import's limits. 413 public_key_too_large; 422 invalid_public_key, private_key_supplied.
 */
export async function readSignerKey(armored: string): Promise<VerificationKey> {
  const key = await readSuppliedPublicKey(armored);
  return { key, fingerprint: key.getFingerprint() };
}

export interface VerifyOptions extends WatchOptions {
  /** Cap on the decompressed size of a compressed signed message. */
  maxDecompressedBytes: number;
}

/** Verifies `data` against a detached signature; resolves after the last byte of `data`. */
export async function verifyDetached(data: Readable, signature: openpgp.Signature, keys: VerificationKey[], opts: VerifyOptions): Promise<SignatureCheck> {
  const watch = new Watch(data, opts);
  watch.check();
  const source = new NodeSource(data, watch);
  try {
    const message = await openpgp.createMessage({ binary: source.open(), format: 'binary' });
    const result = await watch.call(openpgp.verify({ message, signature, verificationKeys: keys.map((k) => k.key), format: 'binary' }));
    return await settle(result, keys, watch, source);
  } catch (err) {
    data.destroy();
    throw watch.failure ?? source.failure ?? err;
  } finally {
    watch.close();
  }
}

/** Verifies a signed message (armored or binary, compressed or not; not encrypted); its content is read and dropped. */
export async function verifySignedMessage(input: Readable, keys: VerificationKey[], opts: VerifyOptions): Promise<SignatureCheck> {
  const watch = new Watch(input, opts);
  watch.check();
  let packets: Pull | undefined;
  try {
    packets = new Pull((await binaryPackets(input)).packets[Symbol.asyncIterator]());
    const first = await packets.peek();
    if (first === null) throw invalid('malformed_message', 'Not an OpenPGP signed message: it is empty.');
    if (ENCRYPTED.has(tagOf(first))) throw invalid('malformed_message', 'The message is encrypted: decrypt it with verify_with instead.');
    const content = await readContent(packets, { maxDecompressedBytes: opts.maxDecompressedBytes, verify: keys, watch });
    for await (const _ of content.data);
    return content.signatures ? await judge(content.signatures, keys) : UNSIGNED;
  } catch (err) {
    input.destroy();
    const inputError = packets?.failed instanceof AppError ? undefined : packets?.failed;
    throw watch.failure ?? inputError ?? (err instanceof AppError ? err : invalid('malformed_message', `The signed message is malformed: ${errMessage(err)}.`));
  } finally {
    watch.close();
  }
}

/** Packets that begin an encrypted message: session keys and encrypted data. */
const ENCRYPTED = new Set([1, 3, 9, 18, 20]);

/** What openpgp.verify and openpgp.decrypt give for a streamed message. */
interface Verified {
  data: WebStream;
  signatures: VerificationResult[];
}

/** Reads the data to its end, then judges the signatures (each verifies only once all bytes were hashed). */
async function settle(result: Verified, keys: VerificationKey[], watch: Watch, source: NodeSource): Promise<SignatureCheck> {
  const drained = new WebSource(result.data, (err) => watch.failure ?? source.failure ?? asError(err), watch);
  for await (const _ of drained);
  return judge(result.signatures, keys);
}
