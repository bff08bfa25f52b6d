import { Readable } from 'node:stream';

/**
 * Passes bytes through unchanged, reporting the running total (for job progress). A generator rather
 * than a Transform: no second buffer, and a consumer that stops early ends the source with it.
 */
export function counted(source: Readable, onBytes: (total: number) => void): Readable {
  let total = 0;
  async function* pass(): AsyncGenerator<Buffer> {
    for await (const chunk of source) {
      total += (chunk as Buffer).length;
      onBytes(total);
      yield chunk as Buffer;
    }
  }
  return Readable.from(pass(), { objectMode: false, highWaterMark: 1 << 20 });
}

export async function readText(source: Readable, maxBytes: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of source) {
    size += (chunk as Buffer).length;
    if (size > maxBytes) throw new Error(`stream longer than ${maxBytes} bytes`);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}
