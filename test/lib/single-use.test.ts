import { describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { release, singleUse } from '../../lib/single-use';

describe('single-use buffers', () => {
  it('releases a marked buffer that is the whole of its memory, once', () => {
    const buf = singleUse(randomBytes(64 << 10));
    release(buf);
    expect([buf.length, (buf.buffer as ArrayBuffer).detached]).toEqual([0, true]);
    expect(() => release(buf)).not.toThrow();
  });

  it('leaves alone what was not marked, a slice of a marked buffer, and a pooled buffer it cannot mark', () => {
    const plain = randomBytes(64 << 10);
    release(plain);
    expect(plain.length).toBe(64 << 10);
    const marked = singleUse(Buffer.alloc(64 << 10, 7));
    const slice = marked.subarray(1);
    release(slice);
    expect([marked.length, slice[0]]).toEqual([64 << 10, 7]);
    const pooled = singleUse(Buffer.from('a small buffer lives in a shared pool'));
    release(pooled);
    expect(pooled.toString()).toBe('a small buffer lives in a shared pool');
  });
});
