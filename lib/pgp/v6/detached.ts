import { invalid } from '../../errors';
import { packet } from '../packets';
import { isSigningAlgorithm, privateParts, publicParts, type SigningAlgorithm } from './key-material';
import {
  KEY_FLAGS,
  draftSignature,
  finishSignature,
  readSignature,
  SHA512,
  SIG,
  SUB,
  signatureHash,
  TAG,
  verifySignature,
  type V6Signature,
} from './packets-v6';
import type { UnlockedV6Key, V6Key, V6KeyPart } from './read-key';
import { packetList, subpacket, u32 } from './wire';

/**
 * Detached v6 signatures over binary data (type 0x00, RFC 9580 §5.2.1.1) by Ed25519 and
 * ML-DSA-65+Ed25519 keys, made and checked on Node's crypto in one pass over the data: SHA-512 with a
 * 32-octet salt, a critical creation time and the issuer's fingerprint in the hashed area.
 */

/** Signatures in one detached signature file, as ../signatures.ts allows. */
const MAX_SIGNATURES = 16;
/** A composite signature packet is about 3.5 KiB. */
const MAX_SIGNATURE_PACKET_BYTES = 16 * 1024;
const CRITICAL = 0x80;

const malformed = (why: string) => invalid('malformed_signature', `A signature cannot be read: ${why}`);

type V6SignatureProblem = 'bad_signature' | 'unknown_signer' | 'signer_key_expired' | 'signer_key_revoked';

export interface V6SignatureCheck {
  valid: boolean;
  /** The key (primary or subkey) that made the signature, when it is one of the key's. */
  signingKeyId: string | null;
  signingFingerprint: string | null;
  created: Date | null;
  reason: V6SignatureProblem | null;
}

/** 422 no_signing_key unless the key may sign at `date`: its primary key signs, and is neither revoked nor expired. */
export function assertMaySign(key: UnlockedV6Key, date = new Date()): void {
  signingSecret(key);
  if (key.key.primary.revoked) throw invalid('no_signing_key', 'This key cannot sign: it is revoked.');
  const expiresAt = key.key.primary.expiresAt;
  if (expiresAt && expiresAt <= date) throw invalid('no_signing_key', `This key cannot sign: it expired at ${expiresAt.toISOString()}.`);
}

/** The primary key's secret, which signs (a signing algorithm, the sign flag). */
function signingSecret(key: UnlockedV6Key): UnlockedV6Key['secrets'][number] & { algorithm: SigningAlgorithm } {
  const [primary] = key.secrets;
  if (!primary || !isSigningAlgorithm(primary.algorithm) || !(key.key.primary.flags & KEY_FLAGS.sign)) throw invalid('no_signing_key', 'This key cannot sign.');
  return { ...primary, algorithm: primary.algorithm };
}

/** The framed signature packet of `key`'s primary key (which must be allowed to sign) over `data`, made at `date` (assertMaySign checks the key's validity then). */
export async function signDetachedV6(key: UnlockedV6Key, data: AsyncIterable<Uint8Array> | Uint8Array, date = new Date()): Promise<Buffer> {
  const primary = signingSecret(key);
  const algorithm: SigningAlgorithm = primary.algorithm;
  const draft = draftSignature(algorithm, SIG.binary, SHA512, [
    subpacket(SUB.created | CRITICAL, u32(Math.floor(date.getTime() / 1000))),
    subpacket(SUB.issuerFingerprint, Buffer.concat([Buffer.from([6]), primary.fingerprint])),
  ]);
  for await (const chunk of chunks(data)) draft.hash.update(chunk);
  return packet(TAG.signature, finishSignature(draft, { algorithm, parts: privateParts(algorithm, primary.secretMaterial) }));
}

/**
 * The verdict on a detached signature file (binary packets) over `data` by `publicKey`: valid when one
 * of its signatures, by one of the key's signing-capable (sub)keys, verifies; otherwise the first
 * problem. A signature made while its key was expired, or by a revoked key, is not valid.
 */
export async function verifyDetachedV6(signatures: Uint8Array, data: AsyncIterable<Uint8Array> | Uint8Array, publicKey: V6Key): Promise<V6SignatureCheck> {
  const check = new DetachedV6Check(readDetachedV6(signatures));
  for await (const chunk of chunks(data)) check.update(chunk);
  return check.verdict([publicKey]);
}

/** The v6 signatures over binary data of a detached signature file (binary packets, at most MAX_SIGNATURES). 422 malformed_signature. */
function readDetachedV6(signatures: Uint8Array): V6Signature[] {
  const packets = packetList(
    Buffer.from(signatures.buffer, signatures.byteOffset, signatures.byteLength),
    { maxPackets: MAX_SIGNATURES, maxPacketBytes: MAX_SIGNATURE_PACKET_BYTES },
    malformed,
  );
  if (!packets.length) throw malformed('no signature');
  return packets.map((p) => {
    if (p.tag !== TAG.signature) throw malformed(`a packet of type ${p.tag} in a detached signature`);
    return readDetachedSignatureV6(p.body);
  });
}

/** One v6 signature packet's body, which must be a signature over binary data. 422 malformed_signature. */
export function readDetachedSignatureV6(body: Buffer): V6Signature {
  const sig = readSignature(body, malformed);
  if (sig.type !== SIG.binary) throw malformed(`a signature of type 0x${sig.type.toString(16)}, not over binary data`);
  return sig;
}

/**
 * v6 detached signatures checked in one pass: `update` with the data as it flows (one hash per
 * signature), then `verdict` against the keys that may have made them, as many times as needed.
 */
export class DetachedV6Check {
  private readonly hashes: ReturnType<typeof signatureHash>[];

  constructor(private readonly sigs: V6Signature[]) {
    this.hashes = sigs.map(signatureHash);
  }

  update(chunk: Uint8Array): void {
    for (const h of this.hashes) h.update(chunk);
  }

  /**
   * Valid when one signature, by a signing-capable (sub)key of one of `keys` (named by its issuer
   * fingerprint), verifies and its key was in force when it signed; otherwise the first problem. `key`
   * is the one of `keys` that made the reported signature (null for an unknown signer).
   */
  verdict(keys: V6Key[]): V6SignatureCheck & { key: V6Key | null } {
    let first: (V6SignatureCheck & { key: V6Key | null }) | undefined;
    for (const [i, sig] of this.sigs.entries()) {
      const found = keys.map((key) => ({ key, signer: signerOf(sig, key, keys.length === 1) })).find((k) => k.signer);
      const signer = found?.signer;
      const base = {
        key: found?.key ?? null,
        signingKeyId: signer?.keyId ?? null,
        signingFingerprint: signer?.fingerprint ?? null,
        created: sig.created === undefined ? null : new Date(sig.created * 1000),
      };
      const problem =
        !found || !signer
          ? 'unknown_signer'
          : !verifySignature(sig, this.hashes[i].copy(), publicParts(signer.algorithm, signer.publicMaterial))
            ? 'bad_signature'
            : standing(sig, signer, found.key);
      if (!problem) return { ...base, valid: true, reason: null };
      first ??= { ...base, valid: false, reason: problem };
    }
    return first!;
  }
}

/**
 * The key's (sub)key that the signature names by its issuer fingerprint, if it may sign; a signature
 * that names none is taken for the primary key's only when there is a single key to try.
 */
function signerOf(sig: V6Signature, key: V6Key, only: boolean): V6KeyPart | undefined {
  const named = sig.issuerFingerprint?.toString('hex') ?? (only ? key.fingerprint : undefined);
  const part = [key.primary, ...key.subkeys].find((k) => k.fingerprint === named);
  return part && part.algorithm === sig.algorithm && part.flags & KEY_FLAGS.sign ? part : undefined;
}

/** Why a verified signature still does not count: its key (or the primary key) revoked, or expired when it signed. */
function standing(sig: V6Signature, signer: V6KeyPart, key: V6Key): V6SignatureProblem | null {
  if (signer.revoked || key.primary.revoked) return 'signer_key_revoked';
  const at = (sig.created ?? 0) * 1000;
  const expired = (k: V6KeyPart) => at < k.created.getTime() || (k.expiresAt !== null && at >= k.expiresAt.getTime());
  return expired(signer) || expired(key.primary) ? 'signer_key_expired' : null;
}

async function* chunks(data: AsyncIterable<Uint8Array> | Uint8Array): AsyncGenerator<Uint8Array> {
  if (data instanceof Uint8Array) yield data;
  else yield* data;
}
