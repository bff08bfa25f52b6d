import { Transform, type Readable } from 'node:stream';

/** Passes bytes through unchanged, reporting the running total (for job progress). */
export function counted(source: Readable, onBytes: (total: number) => void): Readable {
  let total = 0;
  const counter = new Transform({
    highWaterMark: 1 << 20,
    transform(chunk: Buffer, _enc, done) {
      total += chunk.length;
      onBytes(total);
      done(null, chunk);
    },
  });
  source.on('error', (err) => counter.destroy(err));
  // A consumer that gives up early destroys the counter; the source (an open file) must go with it.
  counter.on('close', () => {
    if (!source.readableEnded) source.destroy();
  });
  return source.pipe(counter);
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
