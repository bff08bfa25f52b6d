import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { openStream } from '../../blob/sealed';
import { STREAM_CHUNK_BYTES } from '../../blob/types';
import type { Roots } from '../../root-of-trust/keyring';
import { RootKeyError } from '../../root-of-trust/root-key';
import { ArchiveHeader, BackupError, ByteReader, MAGIC_LINE, Manifest, MANIFEST_MAX, PartHead, sealedName, type PartSum } from './archive';

/** Reads one part's body; it must read the body to its end (or throw) before the next part is read. */
type PartVisitor = (head: Exclude<PartHead, { part: 'manifest' }>, body: AsyncIterable<Buffer>) => Promise<void>;

export interface OpenOptions {
  /** Called for each part but the manifest; without it the parts are only checked. */
  visit?: PartVisitor;
  /**
   * The manifest of an earlier pass (a restore verifies first): each part's checksum is then checked as
   * soon as its body ends, before its visitor sees the end, so a part changed since never completes.
   */
  expected?: Manifest;
}

/** What the archive says of itself in the clear, and the data key its body is sealed under, opened by the root. */
async function openHeader(reader: ByteReader, roots: Roots): Promise<{ header: ArchiveHeader; line: string; key: Buffer }> {
  const magic = await reader.line('first line', 64).catch(() => null);
  if (magic !== MAGIC_LINE) throw new BackupError(`not a backup archive (it does not begin with "${MAGIC_LINE}")`);
  const line = await reader.line('header');
  let header: ArchiveHeader;
  try {
    header = ArchiveHeader.parse(JSON.parse(line ?? ''));
  } catch {
    throw new BackupError("the archive's header is not valid: altered or truncated");
  }
  try {
    return { header, line: line!, key: await roots.unwrap(header) };
  } catch (err) {
    if (!(err instanceof RootKeyError)) throw err;
    throw new BackupError(`the archive does not open with the root key configured here: ${err.message}`);
  }
}

/**
 * Opens an archive with the root keys configured now, reads every part and checks it against the
 * manifest at the end: answers the manifest, or throws a BackupError saying what is wrong (not an
 * archive, another root key, altered, truncated). Streams: memory stays at a chunk or two whatever the size.
 */
export async function openArchive(path: string, roots: Roots, opts: OpenOptions = {}): Promise<{ header: ArchiveHeader; manifest: Manifest }> {
  const file = createReadStream(path, { highWaterMark: STREAM_CHUNK_BYTES });
  try {
    const outer = new ByteReader(file);
    const { header, line, key } = await openHeader(outer, roots);
    const plain = new ByteReader(guarded(openStream(outer.rest(), key, sealedName(line))));
    const sums: PartSum[] = [];
    for (;;) {
      const text = await plain.line('part head');
      if (text === null) throw new BackupError('the archive ends before its manifest: truncated');
      let head: PartHead;
      try {
        head = PartHead.parse(JSON.parse(text));
      } catch {
        throw new BackupError(`the archive holds a part it does not know (${text.slice(0, 80)})`);
      }
      if (head.part === 'manifest') {
        const manifest = await readManifest(plain, header, sums);
        if (!(await plain.atEnd())) throw new BackupError('the archive goes on after its manifest: altered');
        return { header, manifest };
      }
      const what = head.part === 'blob' ? `blob ${head.key}` : 'the database part';
      const sum: PartSum = { part: head.part, ...(head.part === 'blob' ? { key: head.key } : {}), bytes: 0, sha256: '' };
      const want = opts.expected?.parts[sums.length];
      if (opts.expected && (!want || want.part !== sum.part || want.key !== sum.key))
        throw new BackupError(`${what} is not where the manifest put it: the archive changed`);
      const body = summed(plain.segments(what), sum, want, what);
      if (opts.visit) await opts.visit(head, body);
      else for await (const chunk of body) void chunk;
      // The next part begins where this one's body ended: a visitor must read it all.
      if (!sum.sha256) throw new Error(`${what} was not read to its end`);
      sums.push(sum);
    }
  } finally {
    file.destroy();
  }
}

/** The sealed body's failures, said as what they mean for an archive. */
async function* guarded(source: AsyncGenerator<Buffer>): AsyncGenerator<Buffer> {
  try {
    yield* source;
  } catch (err) {
    if (err instanceof BackupError) throw err;
    const why = (err as Error).message.replace(/^sealed blob \S+: /, '');
    throw new BackupError(`the archive is altered or truncated: ${why}`);
  }
}

/** Hashes a body as it is read; with `want`, a mismatch fails the body's last read. */
async function* summed(body: AsyncGenerator<Buffer>, sum: PartSum, want: PartSum | undefined, what: string): AsyncGenerator<Buffer> {
  const hash = createHash('sha256');
  for await (const chunk of body) {
    hash.update(chunk);
    sum.bytes += chunk.length;
    yield chunk;
  }
  sum.sha256 = hash.digest('hex');
  if (want && (want.sha256 !== sum.sha256 || want.bytes !== sum.bytes)) throw new BackupError(`${what} does not match its checksum: the archive changed`);
}

async function readManifest(plain: ByteReader, header: ArchiveHeader, sums: PartSum[]): Promise<Manifest> {
  const pieces: Buffer[] = [];
  let size = 0;
  for await (const piece of plain.segments('the manifest')) {
    size += piece.length;
    if (size > MANIFEST_MAX) throw new BackupError('the manifest is too large: altered');
    pieces.push(Buffer.from(piece));
  }
  let manifest: Manifest;
  try {
    manifest = Manifest.parse(JSON.parse(Buffer.concat(pieces).toString('utf8')));
  } catch {
    throw new BackupError('the manifest is not valid');
  }
  if (manifest.backup_id !== header.backup_id) throw new BackupError("the manifest is another archive's");
  if (manifest.parts.length !== sums.length) throw new BackupError(`the manifest lists ${manifest.parts.length} parts, the archive holds ${sums.length}`);
  for (const [i, s] of sums.entries()) {
    const m = manifest.parts[i];
    if (m.part !== s.part || m.key !== s.key || m.bytes !== s.bytes || m.sha256 !== s.sha256)
      throw new BackupError(`${s.part === 'blob' ? `blob ${s.key}` : 'the database part'} does not match the manifest's checksum`);
  }
  return manifest;
}
