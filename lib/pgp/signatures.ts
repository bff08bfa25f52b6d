import { Readable } from 'node:stream';
import * as openpgp from 'openpgp';
import { AppError, invalid, tooLarge } from '../errors';
import { ONE_PIECE } from '../streams';
import { armorSignature } from './armor';
import { MAX_SIGNATURE_PACKET_BYTES, readSuppliedPublicKey } from './import';
import { isPqcKey, isPqcPrivateKey, scanPackets, type StoredPrivateKey } from './keys';
import { readContent } from './content';
import { Pull, packet, tagOf } from './packets';
import { NodeSource, WebSource, binaryPackets, type WebStream } from './stream';
import { asError, errMessage } from './thrown';
import { Watch, type WatchOptions } from './watch';
import { UNSIGNED, judge, openpgpKeys, type SignatureCheck, type VerificationKey, type VerificationResult } from './verification';
import { DetachedV6Check, assertMaySign, readDetachedSignatureV6, signDetachedV6 } from './v6/detached';
import { MLDSA65_ED25519 } from './v6/key-material';
import type { V6Signature } from './v6/packets-v6';
import type { UnlockedV6Key } from './v6/read-key';
import { packetList } from './v6/wire';

/**
 * OpenPGP signatures, streamed: one pass over the data, hashed as bytes flow, memory flat whatever the
 * size. Signing makes v4 signatures with SHA-256 or stronger (OpenPGP.js never picks less than its
 * MUST-implement SHA-256) and the signing time; verifying reports its result only after the last byte.
 * Every call into OpenPGP.js races the caller's signal and the idle limit (watch.ts). Post-quantum keys
 * (RFC 9980, ML-DSA-65+Ed25519), which OpenPGP.js cannot read, sign and verify detached signatures on
 * Node's crypto (v6/detached.ts), in the same single pass.
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
  if (isPqcPrivateKey(signingKey)) return signPqc(input, signingKey, opts, watch);
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
 * A detached signature by a post-quantum key, on Node's crypto: one pass over `input` (memory flat),
 * the signature's one packet (or its armor) once the last byte is in. A signed message is refused: a
 * post-quantum signature inside one could be read by no OpenPGP.js we verify with.
 */
function signPqc(input: Readable, key: UnlockedV6Key, opts: SignOptions, watch: Watch): Readable {
  try {
    if (!opts.detached)
      throw invalid(
        'signed_message_unsupported',
        'A post-quantum key makes detached signatures only: sign with detached: true (the .sig or .asc beside the file).',
      );
    assertMaySign(key); // refused now (revoked, expired), not once the data has been read
  } catch (err) {
    watch.close();
    throw err;
  }
  async function* data(): AsyncGenerator<Uint8Array> {
    for await (const chunk of input) yield chunk as Buffer;
  }
  async function* signed(): AsyncGenerator<Buffer> {
    try {
      const signature = await signDetachedV6(key, data());
      yield opts.armor ? Buffer.from(armorSignature(signature)) : signature;
    } catch (err) {
      throw watch.failure ?? err;
    } finally {
      watch.close();
    }
  }
  const out = Readable.from(signed(), ONE_PIECE);
  watch.onFail((err) => out.destroy(err));
  return out;
}

/**
 * A detached signature file as read: the signatures OpenPGP.js reads (v4, and v6 by Ed25519 keys), and
 * the v6 signatures by post-quantum keys (algorithm 30), which it cannot read, for v6/detached.ts.
 */
export interface DetachedSignature {
  openpgp: openpgp.Signature | null;
  pqc: V6Signature[];
}

/**
 * Reads a detached signature file (armored or binary) sent with a request: only signature packets,
 * each at most MAX_SIGNATURE_PACKET_BYTES (huge subpacket areas are refused unread). 413 signature_too_large; 422 malformed_signature.
 */
export async function readDetachedSignature(bytes: Uint8Array): Promise<DetachedSignature> {
  if (bytes.length > MAX_SIGNATURE_BYTES) throw tooLarge('signature_too_large', `A signature is larger than ${MAX_SIGNATURE_BYTES} bytes.`);
  const malformed = (why: string) => invalid('malformed_signature', `A signature cannot be read: ${why}`);
  const armored = Buffer.from(bytes.subarray(0, 64)).toString('latin1').trimStart().startsWith('-----BEGIN PGP SIGNATURE-----');
  try {
    const binary = armored ? new Uint8Array(await new Response((await openpgp.unarmor(Buffer.from(bytes).toString('utf8'))).data).arrayBuffer()) : bytes;
    const packets = scanPackets(binary);
    if (packets.length === 0 || packets.length > MAX_SIGNATURES || packets.some((p) => p.tag !== 2))
      throw malformed(`expected 1 to ${MAX_SIGNATURES} signature packets.`);
    if (packets.some((p) => p.length > MAX_SIGNATURE_PACKET_BYTES)) throw malformed(`a signature packet is longer than ${MAX_SIGNATURE_PACKET_BYTES} octets.`);
    const bodies = packetList(Buffer.from(binary.buffer, binary.byteOffset, binary.byteLength), LIMITS, (why) => malformed(`${why}.`)).map((p) => p.body);
    // The body: version, signature type, public-key algorithm.
    const isPqc = (body: Buffer) => body[0] === 6 && body[2] === MLDSA65_ED25519;
    const others = bodies.filter((b) => !isPqc(b));
    return {
      openpgp: others.length ? await openpgp.readSignature({ binarySignature: Buffer.concat(others.map((b) => packet(2, b))) }) : null,
      pqc: bodies.filter(isPqc).map(readDetachedSignatureV6),
    };
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
  return { key, fingerprint: isPqcKey(key) ? key.fingerprint : key.getFingerprint() };
}

export interface VerifyOptions extends WatchOptions {
  /** Cap on the decompressed size of a compressed signed message. */
  maxDecompressedBytes: number;
}

/**
 * Verifies `data` against a detached signature; resolves after the last byte of `data`. Post-quantum
 * signatures are hashed as the same bytes flow to OpenPGP.js (or alone, when there are only those).
 * The verdict: a valid signature by a known key if any (OpenPGP.js's first), else the first problem.
 */
export async function verifyDetached(data: Readable, signature: DetachedSignature, keys: VerificationKey[], opts: VerifyOptions): Promise<SignatureCheck> {
  const watch = new Watch(data, opts);
  watch.check();
  const pqc = signature.pqc.length ? new DetachedV6Check(signature.pqc) : null;
  const input = pqc ? Readable.from(tap(data, pqc), ONE_PIECE) : data;
  const source = new NodeSource(input, watch);
  try {
    let check: SignatureCheck | null = null;
    if (signature.openpgp) {
      const message = await openpgp.createMessage({ binary: source.open(), format: 'binary' });
      const result = await watch.call(openpgp.verify({ message, signature: signature.openpgp, verificationKeys: openpgpKeys(keys), format: 'binary' }));
      check = await settle(result, keys, watch, source);
    } else {
      for await (const _ of input);
      watch.check();
    }
    const pqcCheck = pqc ? pqcVerdict(pqc, keys) : null;
    return [check, pqcCheck].find((c) => c?.valid) ?? check ?? pqcCheck!;
  } catch (err) {
    data.destroy();
    throw watch.failure ?? source.failure ?? err;
  } finally {
    watch.close();
  }
}

/** Verifies a signed message (armored or binary, compressed or not; not encrypted); its content is read and dropped. */
export async function verifySignedMessage(input: Readable, keys: VerificationKey[], opts: VerifyOptions): Promise<SignatureCheck> {
  if (keys.length && keys.every((k) => isPqcKey(k.key))) {
    input.destroy();
    throw invalid('signed_message_unsupported', "A post-quantum key's signatures are verified as detached signatures only: send the file with its signature.");
  }
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

/** As readDetachedSignature bounds a signature file. */
const LIMITS = { maxPackets: MAX_SIGNATURES, maxPacketBytes: MAX_SIGNATURE_PACKET_BYTES };

/** The data unchanged, each chunk hashed for the post-quantum signatures on its way. */
async function* tap(data: Readable, check: DetachedV6Check): AsyncGenerator<Buffer> {
  for await (const chunk of data) {
    check.update(chunk as Buffer);
    yield chunk as Buffer;
  }
}

/** The post-quantum signatures' verdict against the post-quantum keys among `keys`, in SignatureCheck's words. */
function pqcVerdict(check: DetachedV6Check, keys: VerificationKey[]): SignatureCheck {
  const v = check.verdict(keys.flatMap((k) => (isPqcKey(k.key) ? [k.key] : [])));
  return {
    valid: v.valid,
    signer_fingerprint: keys.find((k) => k.key === v.key)?.fingerprint ?? null,
    signed_at: v.created?.toISOString() ?? null,
    reason: v.reason,
  };
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
