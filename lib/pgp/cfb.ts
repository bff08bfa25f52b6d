import type * as NodeCrypto from 'node:crypto';

export interface CfbDecryptor {
  /** The plaintext of `ciphertext`, as many octets as it has (CFB is a stream mode). */
  update(ciphertext: Buffer): Buffer;
}

/**
 * AES-CFB decryption with a zero IV and no resync, as OpenPGP's SEIPDv1 packet uses it, at the speed of
 * AES-ECB. CFB decrypts P_i = C_i XOR E(C_{i-1}); all the E(C_{i-1}) of a chunk are known up front, so
 * OpenSSL computes them in one pipelined ECB call, where its CFB mode goes block after block: 0.65
 * instead of 1.6 CPU-s per GiB on the development machine. `ecb` is e.g. 'aes-256-ecb'.
 *
 * Used by the rewrap's MDC thread. The decrypt path (native.ts) keeps OpenSSL's CFB: there the extra
 * buffers per chunk (its pieces rarely start on a block) cost what the ECB call saves (bench/pipeline.ts:
 * 4.75 CPU-s per GiB either way).
 *
 * Self-contained (the crypto module is passed in): lib/pgp/mdc-thread.ts runs it from its source text.
 */
export function cfbDecryptor(crypto: typeof NodeCrypto, ecb: string, key: Uint8Array): CfbDecryptor {
  const block = crypto.createCipheriv(ecb, key, null);
  block.setAutoPadding(false);
  let previous = Buffer.alloc(16); // the last whole ciphertext block: the IV at first
  const current = Buffer.alloc(16); // ciphertext of a block under way (`used` octets of it)
  let keystream = Buffer.alloc(16); // E(previous), for a block under way
  let used = 0;
  let scratch = Buffer.alloc(0); // reused for the ECB input: one allocation, not one per chunk
  /** out ^= data, 4 octets at a time where both are aligned for it (out, fresh from OpenSSL, is). */
  const xorInto = (out: Buffer, data: Buffer) => {
    const src = (data.byteOffset & 3) === 0 ? data : Buffer.from(data);
    const words = out.length >> 2;
    const a = new Int32Array(out.buffer, out.byteOffset, words);
    const b = new Int32Array(src.buffer, src.byteOffset, words);
    for (let i = 0; i < words; i++) a[i]! ^= b[i]!;
    for (let i = words << 2; i < out.length; i++) out[i]! ^= src[i]!;
  };
  return {
    update(c) {
      let at = 0;
      let out: Buffer | undefined;
      if (used > 0) {
        // Finish the block under way with its keystream.
        out = Buffer.allocUnsafe(c.length);
        at = Math.min(16 - used, c.length);
        for (let i = 0; i < at; i++) out[i] = c[i]! ^ keystream[used + i]!;
        c.copy(current, used, 0, at);
        used += at;
        if (used < 16) return out;
        previous = Buffer.from(current);
        used = 0;
      }
      const whole = (c.length - at) & ~15;
      if (whole) {
        // E(C_{i-1}) of every whole block: the previous block, then this chunk's blocks but its last.
        if (scratch.length < whole) scratch = Buffer.allocUnsafeSlow(whole);
        const shifted = scratch.subarray(0, whole);
        previous.copy(shifted, 0);
        c.copy(shifted, 16, at, at + whole - 16);
        const plain = block.update(shifted);
        xorInto(plain, c.subarray(at, at + whole));
        previous = Buffer.from(c.subarray(at + whole - 16, at + whole));
        if (!out && whole === c.length) return plain; // the common case: whole blocks, no copy
        out ??= Buffer.allocUnsafe(c.length);
        plain.copy(out, at);
        at += whole;
      }
      if (at < c.length) {
        // Start a block: its keystream is known already, its ciphertext completes later.
        out ??= Buffer.allocUnsafe(c.length);
        keystream = block.update(previous);
        used = c.length - at;
        for (let i = 0; i < used; i++) out[at + i] = c[at + i]! ^ keystream[i]!;
        c.copy(current, 0, at);
      }
      return out ?? Buffer.alloc(0);
    },
  };
}
