/**
 * Buffers made for one consumer, whose memory that consumer gives back as soon as it is done with the bytes
 * instead of leaving it to the garbage collector. A large transfer makes such buffers (a job blob's sealed and
 * opened chunks) faster than V8's incremental marking frees them: left to it, they were most of the API's
 * peak RSS (docs/performance.md, "Where the API's memory goes").
 *
 * The contract: a stage marks a buffer only when it made it and hands it on whole, keeping no view of it; a
 * stage releases only a buffer it was handed whole, once nothing it passed the bytes to reads them any more
 * (the file write or the socket write has completed). Releasing detaches the memory
 * (ArrayBuffer.prototype.transfer), so any other view would read zero bytes: where a stage cannot keep the
 * contract it does not mark, and its buffers are the collector's as before.
 */
const marked = new WeakSet<ArrayBufferLike>();

const isWhole = (buf: Uint8Array) => buf.byteOffset === 0 && buf.byteLength === buf.buffer.byteLength;

/** Marks `buf` single-use when it is the whole of its memory (a pooled or sliced buffer never is). */
export function singleUse(buf: Buffer): Buffer {
  if (isWhole(buf)) marked.add(buf.buffer);
  return buf;
}

/** Gives back the memory of a single-use buffer at once; any other buffer is left alone. */
export function release(buf: Uint8Array): void {
  const memory = buf.buffer;
  if (isWhole(buf) && marked.delete(memory) && memory instanceof ArrayBuffer) memory.transfer(0);
}
