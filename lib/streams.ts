import { Readable } from 'node:stream';

/**
 * Options of the generator-backed Readables between stages that only compute (count, encrypt, limit,
 * cut): one piece at a time. A Readable's async iterator hands over everything it has buffered as ONE
 * chunk, copied together into a fresh buffer, so a larger mark costs a copy per read wherever a stage
 * yields several pieces per MiB (packet headers beside cipher output). Readables fed by I/O keep a
 * larger mark: there it lets the next read overlap the work.
 */
export const ONE_PIECE = { objectMode: false, highWaterMark: 1 } as const;

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
  return Readable.from(pass(), ONE_PIECE);
}

export async function readText(source: Readable, maxBytes: number): Promise<string> {
  return (await readBytes(source, maxBytes)).toString('utf8');
}

/** The whole of a small stream (a stored key or signature); longer than `maxBytes` is an error. */
export async function readBytes(source: Readable, maxBytes: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of source) {
    size += (chunk as Buffer).length;
    if (size > maxBytes) throw new Error(`stream longer than ${maxBytes} bytes`);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/**
 * An async iterator as a web stream that reads only when its reader asks (highWaterMark 0): no read-ahead
 * beyond the piece asked for. `onCancel` runs when the reader cancels.
 */
export function pullStream(source: AsyncIterator<Uint8Array>, onCancel?: () => void): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>(
    {
      pull: async (controller) => {
        const next = await source.next();
        if (next.done) controller.close();
        else controller.enqueue(next.value);
      },
      cancel: () => {
        onCancel?.();
        void source.return?.();
      },
    },
    { highWaterMark: 0 },
  );
}
