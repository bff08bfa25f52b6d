// openpgp's type definitions name this optional peer dependency, which is not installed: its two stream types, as the package defines them.
declare module '@openpgp/web-stream-tools' {
  export type WebStream<T extends Uint8Array | string> = ReadableStream<T>;
  export type NodeWebStream<T extends Uint8Array | string> = import('node:stream/web').ReadableStream<T>;
}
