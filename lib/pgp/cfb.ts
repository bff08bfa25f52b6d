import { createCipheriv } from 'node:crypto';

/** OpenSSL's ECB of each AES, by OpenPGP.js's session key algorithm name: what cfbDecryptor takes. */
export const AES_ECB: Record<string, string> = { aes128: 'aes-128-ecb', aes192: 'aes-192-ecb', aes256: 'aes-256-ecb' };

export interface CfbDecryptor {
  /**
   * The plaintext of `ciphertext`, as many octets as it has (CFB is a stream mode), in up to three
   * pieces: the end of a block begun by the previous call, the whole blocks, the start of the next block.
   */
  update(ciphertext: Buffer): Buffer[];
}

/**
 * AES-CFB decryption with a zero IV and no resync, as OpenPGP's SEIPDv1 packet uses it, at the speed of
 * AES-ECB. CFB decrypts P_i = C_i XOR E(C_{i-1}); all the E(C_{i-1}) of a chunk are known up front, so
 * OpenSSL computes them in one pipelined ECB call, where its CFB mode goes block after block (ECB is
 * several times cheaper; docs/performance.md; `npm run bench` with bench/pipeline.ts shows it). `ecb` is
 * e.g. 'aes-256-ecb'.
 */
export function cfbDecryptor(ecb: string, key: Uint8Array): CfbDecryptor {
  const block = createCipheriv(ecb, key, null);
  block.setAutoPadding(false);
  let previous = Buffer.alloc(16); // the last whole ciphertext block: the IV at first
  const current = Buffer.alloc(16); // ciphertext of a block under way (`used` octets of it)
  let keystream = Buffer.alloc(16); // E(previous), for a block under way
  let used = 0;
  // The ECB input, reused: one allocation, not one per chunk. It holds the ciphertext one block later
  // than the output, aligned, so the XOR below reads it rather than the (unaligned) input.
  let scratch = Buffer.alloc(0);
  /**
   * out[0, n) ^= data[0, n) for n a multiple of 16, 8 octets at a time: both are 8-aligned (fresh from
   * OpenSSL, or scratch). Optimised code keeps 64-bit typed array elements out of BigInt objects: a third of
   * the CPU of 4 octets at a time (0.13 against 0.38 CPU-s per GiB here).
   */
  const xorInto = (out: Buffer, data: Buffer, n: number) => {
    const a = new BigUint64Array(out.buffer, out.byteOffset, n >> 3);
    const b = new BigUint64Array(data.buffer, data.byteOffset, n >> 3);
    for (let i = 0; i < a.length; i += 2) {
      a[i] ^= b[i];
      a[i + 1] ^= b[i + 1];
    }
  };
  return {
    update(c) {
      const out: Buffer[] = [];
      let at = 0;
      if (used > 0) {
        // Finish the block under way with its keystream.
        at = Math.min(16 - used, c.length);
        const head = Buffer.allocUnsafe(at);
        for (let i = 0; i < at; i++) head[i] = c[i] ^ keystream[used + i];
        out.push(head);
        c.copy(current, used, 0, at);
        used += at;
        if (used < 16) return out;
        previous = Buffer.from(current);
        used = 0;
      }
      const whole = (c.length - at) & ~15;
      if (whole) {
        // E(C_{i-1}) of every whole block: the previous block, then this chunk's blocks.
        if (scratch.length < whole + 16) scratch = Buffer.allocUnsafeSlow(whole + 16);
        previous.copy(scratch, 0);
        c.copy(scratch, 16, at, at + whole);
        const plain = block.update(scratch.subarray(0, whole));
        xorInto(plain, scratch.subarray(16), whole);
        previous = Buffer.from(c.subarray(at + whole - 16, at + whole));
        out.push(plain);
        at += whole;
      }
      if (at < c.length) {
        // Start a block: its keystream is known already, its ciphertext completes later.
        keystream = block.update(previous);
        used = c.length - at;
        const tail = Buffer.allocUnsafe(used);
        for (let i = 0; i < used; i++) tail[i] = c[at + i] ^ keystream[i];
        out.push(tail);
        c.copy(current, 0, at);
      }
      return out;
    },
  };
}
