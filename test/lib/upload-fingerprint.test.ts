import { describe, expect, it } from 'vitest';
import { createCipheriv, hkdfSync, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { fingerprinted } from '../../lib/upload-fingerprint';

/** Reads a file through `fingerprinted` in the given pieces; returns what came out and the fingerprint. */
async function run(pieces: Buffer[], key: Buffer, n: number): Promise<{ out: Buffer; fingerprint: string }> {
  let fingerprint = '';
  const chunks: Buffer[] = [];
  for await (const c of fingerprinted(Readable.from(pieces), key, n, (hex) => (fingerprint = hex))) chunks.push(c as Buffer);
  return { out: Buffer.concat(chunks), fingerprint };
}

describe('upload fingerprints (Idempotency-Key replays)', () => {
  const key = randomBytes(32);
  const data = randomBytes(300_000);

  it('is the GMAC of the whole file under the derived key and the file index, however the file arrives in pieces', async () => {
    const nonce = Buffer.alloc(12);
    nonce.writeUInt32BE(2, 8);
    const gmac = createCipheriv('aes-256-gcm', Buffer.from(hkdfSync('sha256', key, Buffer.alloc(0), 'kms/upload-fingerprint/v1', 32)), nonce).setAAD(data);
    gmac.final();
    const expected = gmac.getAuthTag().toString('hex');
    const whole = await run([data], key, 2);
    expect(whole.out.equals(data)).toBe(true);
    expect(whole.fingerprint).toBe(expected);
    const ragged = await run([data.subarray(0, 1), data.subarray(1, 65_537), data.subarray(65_537, 65_540), data.subarray(65_540)], key, 2);
    expect(ragged.out.equals(data)).toBe(true);
    expect(ragged.fingerprint).toBe(expected);
  });

  it('differs for one changed bit, another index, another key, and an empty file has one too', async () => {
    const base = (await run([data], key, 0)).fingerprint;
    const flipped = Buffer.from(data);
    flipped[150_000]! ^= 0x10;
    expect((await run([flipped], key, 0)).fingerprint).not.toBe(base);
    expect((await run([data], key, 1)).fingerprint).not.toBe(base);
    expect((await run([data], randomBytes(32), 0)).fingerprint).not.toBe(base);
    expect((await run([data.subarray(0, data.length - 1)], key, 0)).fingerprint).not.toBe(base);
    expect((await run([], key, 0)).fingerprint).toMatch(/^[0-9a-f]{32}$/);
  });
});
