import type { Readable } from 'node:stream';
import type { Container } from '../lib/container';
import { counted } from '../lib/streams';
import { jobBlob } from '../lib/services/jobs';
import { jobFiles, type JobFileRow, type JobProgress, type OutputFile } from '../db/jobs';
import type { Progress } from './tracked';

export interface Transformed {
  stream: Readable;
  name: string;
  contentType: string;
}

export interface FilesDone {
  inputs: JobFileRow[];
  outputs: OutputFile[];
  bytesTotal: number;
  progress: JobProgress;
  /** Deletes the uploads (plaintext, for encryption) once the job's completion is committed. */
  deleteInputs(): Promise<void>;
}

/**
 * Streams each input blob of a job through `transform` into its output blob, one file at a time,
 * reporting input bytes as progress. Outputs are atomic puts: a stream that errors publishes nothing.
 */
export async function transformFiles(c: Container, jobId: string, progress: Progress, transform: (source: Readable, file: JobFileRow) => Promise<Transformed>): Promise<FilesDone> {
  const inputs = await jobFiles(c.db, jobId, 'input');
  const bytesTotal = inputs.reduce((n, f) => n + f.size, 0);
  const outputs: OutputFile[] = [];
  let before = 0;
  for (const [i, file] of inputs.entries()) {
    const source = counted(await c.blob.get(jobBlob.input(jobId, file.n)), (n) => progress.report({ bytes_done: before + n }));
    const out = await transform(source, file);
    const { size } = await c.blob.put(jobBlob.output(jobId, file.n), out.stream);
    before += file.size;
    progress.report({ bytes_done: before, files_done: i + 1 });
    outputs.push({ n: file.n, name: out.name, size, content_type: out.contentType });
  }
  return {
    inputs,
    outputs,
    bytesTotal,
    progress: { bytes_done: bytesTotal, bytes_total: bytesTotal, files_done: inputs.length, files_total: inputs.length },
    deleteInputs: async () => {
      await Promise.all(inputs.map((f) => c.blob.delete(jobBlob.input(jobId, f.n))));
    },
  };
}
