import * as crypto from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { cfbDecryptor } from '../../lib/pgp/cfb';

const key = crypto.randomBytes(32);
const encrypt = (plain: Buffer) => crypto.createCipheriv('aes-256-cfb', key, Buffer.alloc(16)).update(plain);

describe('cfbDecryptor (AES-CFB decrypted through ECB)', () => {
  it.each([0, 1, 15, 16, 17, 1000, (1 << 20) - 1, 1 << 20, (1 << 20) + 17])('matches OpenSSL CFB on %i bytes in uneven, misaligned pieces', (size) => {
    const plain = crypto.randomBytes(size);
    const cipher = encrypt(plain);
    const d = cfbDecryptor('aes-256-ecb', key);
    const out: Buffer[] = [];
    // Pieces of 1, 3, 7, 13, ... octets, each a view at an odd offset of a larger buffer.
    for (let at = 0, n = 1; at < cipher.length; at += n, n = n * 2 + 1) {
      const piece = cipher.subarray(at, at + n);
      const holder = Buffer.alloc(piece.length + 3);
      piece.copy(holder, 3);
      const pieces = d.update(holder.subarray(3));
      expect(pieces.length).toBeLessThanOrEqual(3);
      expect(Buffer.concat(pieces).length).toBe(piece.length); // a stream mode: every octet at once
      out.push(...pieces);
    }
    expect(Buffer.concat(out).equals(plain)).toBe(true);
  });
});
