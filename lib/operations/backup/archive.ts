/**
 * The backup archive's format (docs/backup-and-restore.md):
 *
 *   "KMS-BACKUP/1\n"
 *   header JSON "\n"        in the clear: the archive's id and time, and the keyring data key it is sealed
 *                           under as the keyring stores it (key id, root id, wrapped by that root)
 *   sealed stream           lib/blob/sealed.ts's STREAM construction under that data key, bound to the
 *                           SHA-256 of the header line: a changed header, chunk or length does not open
 *
 * The sealed plaintext is a sequence of parts, each a JSON line and then its body as segments
 * (4-byte big-endian length, bytes), ended by a zero length: the database (pg_dump's plain SQL, gzip),
 * one part per blob, and last the manifest, whose checksums cover every part before it.
 */
import { createHash } from 'node:crypto';
import { z } from 'zod';

export const MAGIC_LINE = 'KMS-BACKUP/1';
export const FORMAT = 'kms-backup/1';
/** The longest JSON line (header or part head) a reader accepts. */
const LINE_MAX = 64 * 1024;
/** The longest manifest a reader accepts: it lists one entry per blob. */
export const MANIFEST_MAX = 64 * 1024 * 1024;

/** A backup that cannot be taken, verified or restored, said in one line for the operator (exit code 1). */
export class BackupError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BackupError';
  }
}

export const ArchiveHeader = z.strictObject({
  format: z.literal(FORMAT),
  backup_id: z.uuid(),
  created_at: z.iso.datetime(),
  kid: z.string().min(1).max(64),
  root_id: z.string().min(1).max(512),
  wrapped: z.string().min(1).max(4096),
});
export type ArchiveHeader = z.infer<typeof ArchiveHeader>;

export const PartHead = z.discriminatedUnion('part', [
  z.strictObject({ part: z.literal('database'), encoding: z.literal('pg_dump-plain+gzip') }),
  z.strictObject({ part: z.literal('blob'), key: z.string().min(1).max(512) }),
  z.strictObject({ part: z.literal('manifest') }),
]);
export type PartHead = z.infer<typeof PartHead>;

const PartSum = z.strictObject({
  part: z.enum(['database', 'blob']),
  key: z.string().optional(),
  bytes: z.number().int().nonnegative(),
  sha256: z.string().length(64),
});
export type PartSum = z.infer<typeof PartSum>;

export const Manifest = z.strictObject({
  format: z.literal(FORMAT),
  backup_id: z.uuid(),
  created_at: z.iso.datetime(),
  versions: z.strictObject({ service: z.string(), postgres: z.string(), pg_dump: z.string(), node: z.string() }),
  /** The migrations applied in the snapshot, in order; the last is its level. */
  migrations: z.array(z.string()),
  keyring: z.array(z.strictObject({ kid: z.string(), root_id: z.string(), retired: z.boolean(), current: z.boolean() })),
  /** Rows per table in the snapshot. */
  counts: z.record(z.string(), z.number().int().nonnegative()),
  /** Blobs rows pointed to that were gone when read (purged while the backup ran). */
  blobs_gone: z.array(z.string()),
  parts: z.array(PartSum),
});
export type Manifest = z.infer<typeof Manifest>;

/** The name a sealed archive body is bound to: its header line, so the header cannot be swapped. */
export const sealedName = (headerLine: string) => `kms/backup/v1:${createHash('sha256').update(headerLine).digest('hex')}`;

const SEGMENT_MAX = 16 << 20;

function lengthOf(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
}

/** One part of the plaintext: its head line, then `body` as segments; `sum` is filled in as it streams. */
export async function* partBytes(head: PartHead, body: AsyncIterable<Buffer | Uint8Array | string> | Iterable<Buffer>, sum: PartSum): AsyncGenerator<Buffer> {
  yield Buffer.from(`${JSON.stringify(head)}\n`);
  const hash = createHash('sha256');
  for await (const chunk of body) {
    let buf = typeof chunk === 'string' ? Buffer.from(chunk) : Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    while (buf.length > 0) {
      const piece = buf.subarray(0, SEGMENT_MAX);
      buf = buf.subarray(piece.length);
      hash.update(piece);
      sum.bytes += piece.length;
      yield lengthOf(piece.length);
      yield piece;
    }
  }
  sum.sha256 = hash.digest('hex');
  yield lengthOf(0);
}

/**
 * Reads a byte stream in the pieces the format needs, without copying bodies: a body's bytes are handed
 * on as slices of the buffers read.
 */
export class ByteReader {
  private buf: Buffer = Buffer.alloc(0);
  private readonly it: AsyncIterator<Buffer | string>;

  constructor(source: AsyncIterable<Buffer | string>) {
    this.it = source[Symbol.asyncIterator]();
  }

  private async more(): Promise<boolean> {
    const next = await this.it.next();
    if (next.done) return false;
    const chunk = typeof next.value === 'string' ? Buffer.from(next.value) : next.value;
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    return true;
  }

  /** The next line without its "\n"; null at the very end; a BackupError past `max` or at an end inside it. */
  async line(what: string, max = LINE_MAX): Promise<string | null> {
    for (let from = 0; ;) {
      const at = this.buf.indexOf(10, from);
      if (at >= 0) {
        const text = this.buf.subarray(0, at).toString('utf8');
        this.buf = this.buf.subarray(at + 1);
        return text;
      }
      from = this.buf.length;
      if (from > max) throw new BackupError(`the archive's ${what} is longer than ${max} bytes: not a backup archive, or altered`);
      if (!(await this.more())) {
        if (this.buf.length === 0) return null;
        throw new BackupError(`the archive ends inside its ${what}: truncated`);
      }
    }
  }

  async exact(n: number, what: string): Promise<Buffer> {
    while (this.buf.length < n) if (!(await this.more())) throw new BackupError(`the archive ends inside ${what}: truncated`);
    const out = this.buf.subarray(0, n);
    this.buf = this.buf.subarray(n);
    return out;
  }

  /** `n` bytes as slices of what is read. */
  async *take(n: number, what: string): AsyncGenerator<Buffer> {
    while (n > 0) {
      if (this.buf.length === 0 && !(await this.more())) throw new BackupError(`the archive ends inside ${what}: truncated`);
      const piece = this.buf.subarray(0, n);
      this.buf = this.buf.subarray(piece.length);
      n -= piece.length;
      yield piece;
    }
  }

  /** A part's body: its segments up to the zero length. */
  async *segments(what: string): AsyncGenerator<Buffer> {
    for (;;) {
      const n = (await this.exact(4, what)).readUInt32BE();
      if (n === 0) return;
      if (n > SEGMENT_MAX) throw new BackupError(`${what} has a segment of ${n} bytes: altered`);
      yield* this.take(n, what);
    }
  }

  /** Everything not read yet. */
  async *rest(): AsyncGenerator<Buffer | string> {
    if (this.buf.length) yield this.buf;
    this.buf = Buffer.alloc(0);
    for (let next = await this.it.next(); !next.done; next = await this.it.next()) yield next.value;
  }

  async atEnd(): Promise<boolean> {
    return this.buf.length === 0 && !(await this.more());
  }
}
