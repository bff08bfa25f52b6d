import { describe, expect, it } from 'vitest';
import { createCipheriv, hkdfSync, randomBytes } from 'node:crypto';
import { PassThrough, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { fingerprintAsRead } from '../../lib/upload-fingerprint';

/**
 * A file arriving in the given pieces, fingerprinted while a reader that starts late (as a blob store does,
 * after opening its file) takes it by async iteration or by pipe; returns what the reader got and the fingerprint.
 */
async function run(pieces: Buffer[], key: Buffer, n: number, reader: 'iterator' | 'pipe' = 'iterator'): Promise<{ out: Buffer; fingerprint: string }> {
  let fingerprint = '';
  const source = new PassThrough();
  fingerprintAsRead(source, key, n, (hex) => (fingerprint = hex));
  for (const p of pieces) source.write(p);
  source.end();
  await sleep(5); // the listener alone must not start the flow: nothing may be lost before the reader comes
  const chunks: Buffer[] = [];
  if (reader === 'iterator') for await (const c of source) chunks.push(c as Buffer);
  else await pipeline(source, new Writable({ write: (c: Buffer, _e, cb) => (chunks.push(c), cb()) }));
  return { out: Buffer.concat(chunks), fingerprint };
}

describe('upload fingerprints (Idempotency-Key replays)', () => {
  const key = randomBytes(32);
  const data = randomBytes(300_000);

  it('is the GMAC of the whole file under the derived key and the file index, however it arrives and is read', async () => {
    const nonce = Buffer.alloc(12);
    nonce.writeUInt32BE(2, 8);
    const gmac = createCipheriv('aes-256-gcm', Buffer.from(hkdfSync('sha256', key, Buffer.alloc(0), 'kms/upload-fingerprint/v1', 32)), nonce).setAAD(data);
    gmac.final();
    const expected = gmac.getAuthTag().toString('hex');
    const whole = await run([data], key, 2);
    expect(whole.out.equals(data)).toBe(true);
    expect(whole.fingerprint).toBe(expected);
    const pieces = [data.subarray(0, 1), data.subarray(1, 65_537), data.subarray(65_537, 65_540), data.subarray(65_540)];
    for (const reader of ['iterator', 'pipe'] as const) {
      const ragged = await run(pieces, key, 2, reader);
      expect(ragged.out.equals(data), reader).toBe(true);
      expect(ragged.fingerprint, reader).toBe(expected);
    }
  });

  it('differs for one changed bit, another index, another key, and an empty file has one too', async () => {
    const base = (await run([data], key, 0)).fingerprint;
    const flipped = Buffer.from(data);
    flipped[150_000] ^= 0x10;
    expect((await run([flipped], key, 0)).fingerprint).not.toBe(base);
    expect((await run([data], key, 1)).fingerprint).not.toBe(base);
    expect((await run([data], randomBytes(32), 0)).fingerprint).not.toBe(base);
    expect((await run([data.subarray(0, data.length - 1)], key, 0)).fingerprint).not.toBe(base);
    expect((await run([], key, 0)).fingerprint).toMatch(/^[0-9a-f]{32}$/);
  });
});
