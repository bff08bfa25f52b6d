declare module '@openpgp/unbzip2-stream' {
  /** Decompresses a bzip2 stream, block by block, pulling its input as output is read. */
  export default function unbzip2Stream(input: ReadableStream<Uint8Array>): ReadableStream<Uint8Array>;
}
